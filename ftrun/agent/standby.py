"""This host's part in the standby controller (docs/standby.md).

Every agent learns where the standby controller will listen (`standby`: host, address, port)
and dials it in turn with the primary while its controller is gone (link.py). The standby
host's own agent is told to be the standby (`standby` with port 0): it picks a port, keeps a
replica of the job directory that the primary streams to it (`replicate`: config.json, the
control files, the checkpoint key, the journal line by line), and when it loses the primary it
starts the takeover: `ftrun resume JOB --takeover-port PORT` on that replica, a controller of
the next term that listens at the address the agents dial. That controller adopts the running
generation only if most of its agents come to it (the evidence that the primary is gone for
them too, not only cut off from this host); otherwise it stands down and the primary goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ftrun import envcontract
from ftrun.agent.link import ControlLink
from ftrun.bootstrap import Bootstrap
from ftrun.netutil import ALL_INTERFACES, free_port
from ftrun.wire.messages_standby import REPLICATED

log = logging.getLogger("ftrun.agent")

# A connection to the primary that closed: how long the link may take to reach the primary again
# (it tries the primary's address within its first half second) before the primary is taken for
# gone and the takeover starts.
PRIMARY_CHECK_S = 1.0


class Standby:
    def __init__(self, boot: Bootstrap, link: ControlLink) -> None:
        self.boot = boot
        self.link = link
        self.port = 0
        self.run_dir: Path | None = None  # the replica's run directory, on the standby host
        self.takeover: subprocess.Popen[bytes] | None = None
        self.lost_at = 0.0  # when the primary was last taken for gone (the takeover's detection)

    @property
    def job_dir(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / self.boot.job_id

    def on_standby(self, msg: dict[str, Any]) -> None:
        if msg["port"] == 0:  # this host is the standby
            if msg["host"] != self.boot.host or not msg.get("dir"):
                return
            self.port = self.port or free_port(ALL_INTERFACES)
            self.run_dir = Path(msg["dir"])
            self.job_dir.mkdir(parents=True, mode=0o700, exist_ok=True)  # type: ignore[union-attr]
            self.link.standby = ("127.0.0.1", self.port)  # this agent dials its own takeover
            self.link.send("standby_ready", port=self.port)
        else:
            self.link.standby = (msg.get("addr") or msg["host"], msg["port"])
            log.info("the standby controller will listen at %s:%d", *self.link.standby)

    def replicate(self, msg: dict[str, Any]) -> None:
        """Keep a piece of the job directory: a file whole (written aside, renamed in), or a
        piece of the journal appended. 0600, never through a link."""
        job_dir = self.job_dir
        if job_dir is None or msg["file"] not in REPLICATED:
            return
        target = job_dir / msg["file"]
        data = msg["data"].encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
        if msg["append"]:
            fd = os.open(target, flags | os.O_APPEND, 0o600)
        else:
            target = job_dir / f".{msg['file']}.new"
            fd = os.open(target, flags | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        if not msg["append"]:
            os.replace(target, job_dir / msg["file"])

    def controller_gone(self) -> None:
        """The primary is gone for this host: if this is the standby, start the takeover (once
        at a time: one that stood down may be started again at the next loss).

        Gone by silence, the link already has the evidence (its machine stopped acknowledging
        us: link.py). Gone by a closed connection, it may be the primary's process that died,
        or the primary that dropped this agent (it judged it lost): the link's first attempts
        on the primary's address tell them apart (refused: no process listens there), so the
        takeover starts only if the link is still without a controller PRIMARY_CHECK_S later."""
        if self.job_dir is None:
            return
        self.lost_at = time.time()
        if time.monotonic() - self.link.last_heard >= self.boot.fence_timeout_s:
            self._start_takeover()
        else:
            asyncio.get_running_loop().call_later(PRIMARY_CHECK_S, self._start_if_still_gone)

    def job_over(self) -> None:
        """The controller that led the job to its end said so: a replica nobody took over is a
        copy of the primary's job directory, of no more use; it goes, with the empty
        directories above it. A takeover's replica is the job's own record: it stays."""
        job_dir = self.job_dir
        if job_dir is None or self.takeover is not None or not job_dir.is_dir():
            return
        shutil.rmtree(job_dir, ignore_errors=True)
        for parent in (job_dir.parent, job_dir.parent.parent):  # .standby/<host>, .standby
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if empty: another job's replica may live there

    def _start_if_still_gone(self) -> None:
        if self.link.rejoining:
            self._start_takeover()
        else:
            log.info("the primary took this agent back: it was not gone (no takeover)")

    def _start_takeover(self) -> None:
        job_dir = self.job_dir
        if job_dir is None or not (job_dir / "config.json").exists():
            return
        if self.takeover is not None and self.takeover.poll() is None:
            return
        # Not one of this agent's processes: its sweeps must never kill the new controller.
        env = {k: v for k, v in os.environ.items() if k != envcontract.AGENT_ID}
        argv = [self.boot.python or sys.executable, "-m", "ftrun", "resume", self.boot.job_id]
        argv += ["--run-dir", str(self.run_dir), "--takeover-port", str(self.port)]
        argv += ["--lost-at", repr(self.lost_at)]
        log.warning("the primary controller is gone: starting the standby's takeover")
        with open(job_dir / "takeover.log", "ab") as out:
            self.takeover = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",
                start_new_session=True,  # its own session: our fence and signals do not reach it
            )
