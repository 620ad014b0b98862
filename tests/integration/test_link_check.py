"""The link check before the first step (`--link-check`, controller/link_check.py) on the ssh
testbed: 4 hosts probe their links in two rounds of pairs; a host whose link is slow (its eth0
shaped to 100 Mbit/s, tests/linkshaper.py) is left out of the job with one line saying why, and
with healthy links nobody is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Ftrun
from tests.linkshaper import slow_link
from tests.testbed import Testbed

TOY = str(Path(__file__).resolve().parent.parent / "bin" / "train_toy.py")
HOSTS = "node1,node2,node3,node4"


@pytest.fixture
def bed(testbed: Testbed) -> Testbed:
    return testbed


def run_job(ftrun: Ftrun, bed: Testbed) -> tuple[str, list[dict]]:
    """A short job with --link-check on 4 hosts; its output and journal."""
    done = ftrun.run("launch", "--ssh-config", str(bed.ssh_config), "--hosts", HOSTS,
                     "--link-check", TOY, "--steps", "3", timeout=120)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    [job] = [p.name for p in ftrun.run_dir.iterdir() if not p.name.startswith(".")]
    return out, ftrun.events(job)


def the_check(events: list[dict]) -> dict:
    [check] = [e for e in events if e["kind"] == "link_check"]
    print(json.dumps(check, indent=1))  # the figures, for whoever reads a failure or -s
    return check


def test_healthy_links_leave_nobody_out(ftrun: Ftrun, bed: Testbed) -> None:
    out, events = run_job(ftrun, bed)
    check = the_check(events)
    # Nobody left out. On a loaded machine the check may find the figures too noisy to judge
    # and say so (its note); what it must never do is leave a healthy host out.
    assert check["bad_hosts"] == {}, out
    assert check["note"] is None or "nobody is left out" in check["note"], out
    assert len(check["pairs"]) == 4
    assert all(p["error"] is None for p in check["pairs"]), check
    # A slow link between two healthy hosts would only be said (and on a loaded machine one
    # pair's bandwidth can be far off for a moment): what matters is that nobody is left out.
    assert check["seconds"] < 10 + 5, check  # the target is 10 s; a loaded CI gets some slack
    [launched] = [e for e in events if e["kind"] == "generation_launched"]
    assert launched["hosts"] == HOSTS.split(",")
    # A host left out says ": left out of this job"; a slow pair says "nobody left out for it".
    assert "link check:" in out and "left out of this job" not in out, out
    assert not [e for e in events if e["kind"] == "host_left_out"]


def test_a_host_with_a_slow_link_is_left_out_with_one_line(ftrun: Ftrun, bed: Testbed) -> None:
    with slow_link(bed.host("node3").namespace):
        out, events = run_job(ftrun, bed)
    check = the_check(events)
    assert list(check["bad_hosts"]) == ["node3"], check
    slow = {tuple(p["hosts"]) for p in check["pairs"] if p["slow"]}
    assert slow == {("node3", "node4"), ("node2", "node3")}, check
    [left] = [e for e in events if e["kind"] == "host_left_out"]
    assert left["host"] == "node3" and "bandwidth" in left["reason"]
    [launched] = [e for e in events if e["kind"] == "generation_launched"]
    assert launched["hosts"] == ["node1", "node2", "node4"]
    [line] = [line for line in out.splitlines() if "left out" in line]
    assert "node3 is slow with each of its peers" in line and "Check its network" in line, out
    [job] = [p.name for p in ftrun.run_dir.iterdir() if not p.name.startswith(".")]
    shown = ftrun.status_json(job)["link_check"]  # status --json (and inspect's view) have it
    assert list(shown["bad_hosts"]) == ["node3"] and shown["seconds"] == check["seconds"]
