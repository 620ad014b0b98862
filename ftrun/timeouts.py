"""The control plane's timing knobs, their defaults, and the rules that relate them.

    heartbeat_interval_s   both ends send a heartbeat this often
    host_lost_timeout_s    the controller declares an agent lost after this much silence
                           (a remote agent; a local agent whose process is alive is only "slow")
    fence_timeout_s        an agent kills its ranks after this much silence from the controller
    local_stall_timeout_s  an agent known to be there (its process alive, or its machine still
                           acknowledging us) but silent this long is lost after all (frozen or
                           deadlocked); 0 = never

Where they come from: flags beat the policy file's [timeouts] beat these defaults. How to choose
them: docs/timeouts.md. Ground floor: imports nothing of ftrun.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HEARTBEAT_INTERVAL_S = 0.25
HOST_LOST_TIMEOUT_S = 1.0
FENCE_TIMEOUT_S = 3.0
LOCAL_STALL_TIMEOUT_S = 60.0
EPS = 1e-9  # 0.1 + 0.2 is not 0.3

FLAGS = {
    "heartbeat_interval_s": "--heartbeat-interval",
    "host_lost_timeout_s": "--host-lost-timeout",
    "fence_timeout_s": "--fence-timeout",
    "local_stall_timeout_s": "--local-stall-timeout",
}


@dataclass(frozen=True, kw_only=True)
class ControlTimeouts:
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    host_lost_timeout_s: float = HOST_LOST_TIMEOUT_S
    fence_timeout_s: float = FENCE_TIMEOUT_S
    local_stall_timeout_s: float = LOCAL_STALL_TIMEOUT_S

    def problems(self) -> list[str]:
        """Every rule these values break, each naming the flags (empty when all is well)."""
        out = []
        for name, flag in FLAGS.items():
            value: Any = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                out.append(f"{flag} must be a number of seconds, 0 or more (got {value!r})")
        if out:
            return out
        hb, lost = self.heartbeat_interval_s, self.host_lost_timeout_s
        fence, stall = self.fence_timeout_s, self.local_stall_timeout_s
        if hb <= 0:
            out.append(f"--heartbeat-interval must be more than 0 (got {hb:g})")
        elif lost < 2 * hb - EPS:
            # One late heartbeat must not lose a host: at least two intervals of silence.
            out.append(
                f"--host-lost-timeout ({lost:g} s) must be at least twice "
                f"--heartbeat-interval ({hb:g} s)"
            )
        if fence < lost + hb - EPS:
            # An agent must not fence (kill healthy ranks) on a silence the controller still
            # tolerates: the controller gives up first, then the agent.
            out.append(
                f"--fence-timeout ({fence:g} s) must be at least --host-lost-timeout + "
                f"--heartbeat-interval ({lost + hb:g} s)"
            )
        if stall and stall < lost - EPS:
            out.append(
                f"--local-stall-timeout ({stall:g} s) must be 0 (never) or at least "
                f"--host-lost-timeout ({lost:g} s)"
            )
        return out
