"""The report's attack on a live job (issue 34, item 1), by another user for real (`nobody`):
rename the job directory while the job runs and put one of theirs in its place, so that the
next generation's rank logs go through their links. In a run directory they can write, the job
is refused before it starts; in a sticky one (/tmp-like), the job runs, its directory is 0700,
and neither the rename nor a planted link can be done."""

from __future__ import annotations

import os
import stat

from tests.conftest import BIN, Ftrun, Output, wait_for
from tests.hostile.otheruser import attempt_as_other, shared_tree, sticky_dir

TRAIN = str(BIN / "ckpt_train.py")


def test_a_run_dir_others_can_write_gets_no_job(test_id: str, no_survivors: None):
    with shared_tree() as shared:
        open_dir = shared / "open"
        open_dir.mkdir()
        os.chmod(open_dir, 0o777)
        done = Ftrun(open_dir, test_id).run("launch", TRAIN, "--steps", "2", "--no-memory")
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"the run directory {open_dir} is not safe to use" in done.stderr
        assert "hint:" in done.stderr and "Traceback" not in done.stderr
        assert list(open_dir.iterdir()) == []


def test_in_a_sticky_run_dir_the_job_cannot_be_swapped(test_id: str, no_survivors: None):
    with shared_tree() as shared:
        tmp = sticky_dir(shared)
        proc = Ftrun(tmp, test_id).start(
            "launch", TRAIN, "--steps", "8", "--step-time", "0.3", "--no-memory"
        )
        out = Output(proc)
        try:
            job_dir = wait_for(
                lambda: next(iter(tmp.glob("*/control.json")), None), 60, out.text
            ).parent
            assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
            moved = attempt_as_other(f"mv {job_dir} {tmp}/moved && mkdir -m 777 {job_dir}")
            planted = attempt_as_other(f"ln -s /etc/hostname {job_dir}/logs/g2")
            assert moved.returncode != 0 and "Operation not permitted" in moved.stderr
            assert planted.returncode != 0 and "Permission denied" in planted.stderr
            assert proc.wait(timeout=120) == 0, out.text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert not (tmp / "moved").exists()
        assert (job_dir / "logs" / "g1" / "rank0.log").stat().st_uid == os.geteuid()
        assert sorted(p.name for p in tmp.iterdir()) == [job_dir.name]
