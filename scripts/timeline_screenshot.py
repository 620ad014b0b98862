#!/usr/bin/env python3
"""Make docs/img/timeline.png: the `ftrun inspect --html` page of a real job, as Chromium shows it.

A short job runs on this machine (tests/bin/ckpt_train.py, 2 ranks on gloo, checkpointing with
ftrun.checkpoint): rank 0 is SIGKILLed at step 40 (the script's own --fail-at, once), and when
the relaunched generation steps, `ftrun chaos hang-rank` freezes rank 1 at step 100, so the job
has three generations and two incidents, a crash and a hang, each with its phases. Then
`ftrun inspect JOB --html` writes the page and headless Chromium (tests/browser.py; installed
with apt-get if missing and root) takes the picture.

    python scripts/timeline_screenshot.py [--out docs/img/timeline.png] [--size 1400,700]

About 40 s. The job's run directory is a temporary one, removed afterwards (--keep keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import browser  # noqa: E402

SCRIPT = ROOT / "tests" / "bin" / "ckpt_train.py"
JOB_TIMEOUT_S = 180


def ftrun(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ftrun", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def wait_for(what: str, predicate, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def events(run_dir: Path) -> list[dict]:
    found = list(run_dir.glob("*/events.jsonl"))
    if not found:
        return []
    return [json.loads(line) for line in found[0].read_text().splitlines() if line.strip()]


def run_job(run_dir: Path, work: Path) -> str:
    """Run the demo job to its end; its id."""
    env = {**os.environ, "FTRUN_RUN_DIR": str(run_dir), "PYTHONPATH": str(ROOT)}
    launch = subprocess.Popen(
        [
            sys.executable, "-m", "ftrun", "launch",
            "--job-name", "timeline-demo",
            "--nproc-per-node", "2",
            "--hang-floor", "3",
            str(SCRIPT),
            "--steps", "150", "--step-time", "0.12", "--save-every", "5",
            "--fail-at", "40", "--fail-once", str(work / "failed-once"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(
            "generation 2 to step",
            lambda: any(e["kind"] == "first_step" and e.get("gen") == 2 for e in events(run_dir)),
        )
        job_id = events(run_dir)[0]["job_id"]
        chaos = ftrun(env, "chaos", job_id, "hang-rank", "--rank", "1", "--at-step", "100")
        if chaos.returncode != 0:
            raise SystemExit(f"ftrun chaos failed: {chaos.stderr}")
        _, err = launch.communicate(timeout=JOB_TIMEOUT_S)
        if launch.returncode != 0:
            raise SystemExit(f"the job failed ({launch.returncode}): {err[-2000:]}")
        return job_id
    finally:
        if launch.poll() is None:  # on any error above: stop the job, as Ctrl-C would
            os.killpg(launch.pid, 2)
            launch.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "timeline.png")
    p.add_argument("--size", default="1400,700", help="the browser window, WIDTH,HEIGHT")
    p.add_argument("--keep", action="store_true", help="keep the job's run directory")
    args = p.parse_args()
    chromium = browser.ensure()
    work = Path(tempfile.mkdtemp(prefix="ftrun-timeline-"))
    try:
        run_dir = work / "runs"
        job_id = run_job(run_dir, work)
        page = work / "timeline.html"
        env = {**os.environ, "FTRUN_RUN_DIR": str(run_dir), "PYTHONPATH": str(ROOT)}
        shown = ftrun(env, "inspect", job_id, "--html", str(page))
        if shown.returncode != 0:
            raise SystemExit(f"ftrun inspect failed: {shown.stderr}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        browser.screenshot(chromium, page.as_uri(), args.out.resolve(), size=args.size)
        print(f"{args.out} (job {job_id}; page {page if args.keep else 'removed'})")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
