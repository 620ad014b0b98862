"""The agent's side of the link check (controller/link_check.py): run this host's probe
(linkprobe.py) for the rounds the controller's `link_check` order names, and report its figures
(`link_probed`) with a fresh port of this host for the next rendezvous.

The probe is its own process (it imports torch; the agent never does), in its own session, with
the order's time limit: past it, or when the agent ends meanwhile, its whole group is killed
and reaped. A round it did not report is reported failed, with why.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from ftrun.agent.link import ControlLink
from ftrun.netutil import ALL_INTERFACES, free_port

PROBE = str(Path(__file__).with_name("linkprobe.py"))
# Beyond the order's time limit, before the probe is killed: its own deadline is the order's,
# so this only covers a probe that is stuck (a gloo call that ignores its timeout).
KILL_MARGIN_S = 1.0


async def run_probe(python: str, order: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], str]:
    """The probe's figures by round, and what it said on stderr (its last line)."""
    timeout = float(order["timeout_s"])
    plan = {
        "timeout_s": timeout,
        "slots": [
            {"round": r, "peer": p, "addr": a, "port": port, "rank": rank}
            for r, p, a, port, rank in zip(
                order["rounds"],
                order["peers"],
                order["addrs"],
                order["ports"],
                order["ranks"],
                strict=False,
            )
        ],
    }
    proc = await asyncio.create_subprocess_exec(
        python,
        PROBE,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(json.dumps(plan).encode()), timeout + KILL_MARGIN_S
        )
        why = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
    except asyncio.TimeoutError:
        out, why = b"", f"the probe ran past {timeout:g} s and was killed"
    finally:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
    found: dict[int, dict[str, Any]] = {}
    for line in out.decode(errors="replace").splitlines():
        try:
            figures = json.loads(line)
        except ValueError:
            continue
        if isinstance(figures, dict) and isinstance(figures.get("round"), int):
            found[figures["round"]] = figures
    return found, why


async def link_check(python: str, order: dict[str, Any], link: ControlLink) -> None:
    """Run the order's rounds here and report them."""
    try:
        found, why = await run_probe(python, order)
    except OSError as e:  # the interpreter would not start: every round failed, and why
        found, why = {}, f"cannot start the probe: {e}"
    rounds = list(order["rounds"])
    figures = [found.get(r, {}) for r in rounds]

    def number(f: dict[str, Any], name: str) -> float | None:
        value = f.get(name)
        return float(value) if isinstance(value, (int, float)) and value >= 0 else None

    link.send(
        "link_probed",
        gen=None,
        check=order["check"],
        rounds=rounds,
        peers=list(order["peers"]),
        latency_s=[number(f, "latency_s") for f in figures],
        bandwidth_Bps=[number(f, "bandwidth_Bps") for f in figures],
        errors=[
            None if "latency_s" in f else str(f.get("error") or why or "no figures")[:1000]
            for f in figures
        ],
        port=free_port(ALL_INTERFACES),
    )
