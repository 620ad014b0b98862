"""The link check between generations (`--link-check`: controller/link_check.py's before_join) on
the ssh testbed. A job on 3 hosts (5 wanted) checks them before its first step; a rank's fault
then restarts it in place, which probes nothing; a host added while its link is slow (its eth0
shaped to 100 Mbit/s, tests/linkshaper.py) is probed with two of the job's hosts before it joins
and left out with one line saying why, and the job goes on; a healthy host added next is probed
and joins; the job finishes, and nothing of it is left on any host."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from tests.conftest import BIN, Ftrun, Output, wait_for
from tests.linkshaper import slow_link
from tests.testbed import Testbed

TOY = str(BIN / "train_toy.py")
HOSTS = ["node1", "node2", "node3"]
EVERY = ["node1", "node2", "node3", "node4", "node5"]


def kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


def stepped(ftrun: Ftrun, job: str, gen: int) -> bool:
    return any(e["kind"] == "first_step" and e["gen"] == gen for e in ftrun.events(job))


def test_hosts_joining_are_probed_a_slow_one_left_out_a_good_one_let_in(
    ftrun: Ftrun, testbed: Testbed, tmp_path: Path
) -> None:
    stop, marker = tmp_path / "stop", tmp_path / "failed-once"
    proc = ftrun.start(
        "launch", "--ssh-config", str(testbed.ssh_config), "--hosts", ",".join(HOSTS),
        "--max-nodes", "5", "--link-check", TOY, "--steps", "100000", "--step-time", "0.05",
        "--fail-at", "3", "--fail-rank", "1", "--fail-how", "exit", "--fail-once", str(marker),
        "--stop-file", str(stop),
    )  # fmt: skip
    out = Output(proc)
    try:
        job = ftrun.job_id()
        # Rank 1 exits at step 3 once: a restart in place on the same hosts (generation 2).
        wait_for(lambda: stepped(ftrun, job, 2), 120, lambda: f"generation 2 to step: {out.text()}")
        with slow_link(testbed.host("node4").namespace):
            added = ftrun.run("hosts", job, "add", "node4")
            assert added.returncode == 0, added.stderr
            wait_for(lambda: kinds(ftrun.events(job), "host_left_out"), 120,
                     lambda: f"node4 probed and left out: {out.text()}", interval_s=0.2)  # fmt: skip
        wait_for(lambda: stepped(ftrun, job, 3), 60, "generation 3 (without node4) to step")
        added = ftrun.run("hosts", job, "add", "node5")
        assert added.returncode == 0, added.stderr
        wait_for(lambda: stepped(ftrun, job, 4), 120,
                 lambda: f"the job to grow onto node5: {out.text()}", interval_s=0.2)  # fmt: skip
        stop.touch()
        assert proc.wait(timeout=60) == 0, out.text()
    finally:
        if proc.poll() is None:  # a failed wait: stop the job (its hosts are reset after)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    text, events = out.text(), ftrun.events(job)
    checks = kinds(events, "link_check")
    print(json.dumps(checks, indent=1))  # the figures, for whoever reads a failure or -s
    launched = kinds(events, "generation_launched")
    assert [g["hosts"] for g in launched] == [HOSTS, HOSTS, HOSTS, [*HOSTS, "node5"]]
    first, slow, good = checks
    assert (first["hosts"], first["joining"]) == (HOSTS, [])
    # Each relaunch: the seconds from the end of a generation to the launch of the next, and the
    # link check's in them. The restart in place (generation 2) probed nothing.
    probed = {}
    for gen in launched[1:]:
        [ended] = [e for e in kinds(events, "generation_ended") if e["gen"] == gen["gen"] - 1]
        probed[gen["gen"]] = [c["seconds"] for c in checks if ended["t"] <= c["t"] <= gen["t"]]
        print(f"RELAUNCH gen {gen['gen']}: {gen['t'] - ended['t']:.3f} s after generation "
              f"{ended['gen']} ended; link check {probed[gen['gen']]} s")  # fmt: skip
    assert probed == {2: [], 3: [slow["seconds"]], 4: [good["seconds"]]}, probed

    # node4, probed with node1 and node2 (whose own pair is the typical one), is left out.
    assert (slow["hosts"], slow["joining"]) == (["node1", "node4", "node2"], ["node4"])
    assert list(slow["bad_hosts"]) == ["node4"], slow
    [left] = kinds(events, "host_left_out")
    assert left["host"] == "node4" and "node4 is slow with each of its peers" in left["reason"]
    [line] = [line for line in text.splitlines() if "left out of this job" in line]
    assert "node4 is slow with each of its peers" in line and "Check its network" in line, text
    grow, again = kinds(events, "reconfigure")
    assert grow["why"] == again["why"] == "grow"

    # node5, healthy, is probed the same way and joins.
    assert (good["hosts"], good["joining"]) == (["node1", "node5", "node2"], ["node5"])
    assert good["bad_hosts"] == {}, good
    assert good["note"] is None or "nobody is left out" in good["note"], good
    assert all(p["error"] is None for p in good["pairs"]), good
    for check in (slow, good):  # the target is 10 s for 4 hosts; a loaded CI gets some slack
        assert check["seconds"] < 10 + 5, check
    shown = ftrun.status_json(job)["link_check"]  # status --json (and inspect's view): the last
    assert shown["joining"] == ["node5"] and shown["seconds"] == good["seconds"]
    assert not kinds(events, "fault_detected")[1:]  # the one injected fault, nothing else
    wait_for(lambda: all(testbed.only_sshd(h) for h in EVERY), 15,
             lambda: "only sshd on every host; left: " + testbed.describe_left())  # fmt: skip
