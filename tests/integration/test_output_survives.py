"""Output survives a controller killed with SIGKILL and resumed (issue 36; agent/unacked.py,
controller/output_acks.py): the agents send again what the dead controller had not
acknowledged, and `ftrun resume`, adopting the running generation, writes it. Every step's loss
line is in the job's logs, whatever was in flight when the controller died. The fault is made
deterministic: the controller is stopped (SIGSTOP) for ten steps first, so that what the agent
sends piles up unread in its socket, and the SIGKILL throws that away (before the ring, those
lines were lost). The power-off case, with the standby's takeover, is test_standby.py's."""

from __future__ import annotations

import os
import re
import signal
import time

from tests.conftest import BIN, Output, wait_for
from tests.integration.ckpt_helpers import kill_and_adopt, recorded_steps

TRAIN = str(BIN / "ckpt_train.py")
STEPS = 60  # killed at step 8: the ranks train on without a controller, then are adopted
LOSS = re.compile(r"LOSS rank=(\d+) step=(\d+) ")


def test_every_line_reaches_the_logs_across_a_kill_and_a_resume(ftrun, tmp_path):
    args = ("--nproc-per-node", "2", TRAIN, "--steps", str(STEPS), "--step-time", "0.05")
    proc = ftrun.start("launch", *args, "--no-memory", "--record", str(tmp_path))
    out = Output(proc)
    out.wait_for("[rank1]: LOSS rank=1 step=8 ", 120)  # then killed at once
    [job] = [j["job_id"] for j in ftrun.status_json()]
    os.kill(proc.pid, signal.SIGSTOP)  # `ftrun launch` is the controller: it reads no more
    stopped_t = time.time()
    wait_for(
        lambda: sum(t > stopped_t for _, t in recorded_steps(tmp_path, 1)) >= 10,
        30,
        "steps while the controller is stopped",
    )
    kill_and_adopt(ftrun, proc, job, tmp_path, hosts="localhost", steps=STEPS)
    written: dict[int, list[int]] = {0: [], 1: []}
    for path in sorted((ftrun.run_dir / job / "logs").glob("g1/rank*.log")):
        for rank, step in LOSS.findall(path.read_text(errors="replace")):
            written[int(rank)].append(int(step))
    for rank, steps in written.items():
        missing = sorted(set(range(1, STEPS + 1)) - set(steps))
        assert not missing, f"rank {rank}: no line for steps {missing}"
    # Written twice only what the killed controller wrote in its last heartbeat interval.
    twice = {rank: len(steps) - len(set(steps)) for rank, steps in written.items()}
    assert all(n <= 20 for n in twice.values()), twice  # a second of steps, on a busy machine
    print(f"lines written twice: {twice}")
