"""Multi-host jobs over real ssh on the namespace testbed (scripts/testbed.sh, docs/testbed.md):
a killed host replaced by a spare (which restores its ranks from a peer's memory,
docs/peercopy.md), a job that shrinks and grows back, a partitioned host that
trains on while the next generation runs and is fenced off (docs/fencing.md), unreachable hosts
at start, and teardown that leaves nothing on any host."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import Output, wait_for
from tests.integration.ckpt_helpers import kill_and_adopt, recorded_steps
from tests.testbed import Testbed

BIN = Path(__file__).resolve().parent.parent / "bin"
TOY = str(BIN / "train_toy.py")
CKPT_TRAIN = str(BIN / "ckpt_train.py")


@pytest.fixture
def bed(testbed: Testbed) -> Testbed:
    """The session's testbed: every host powered on, connected and running nothing but its sshd
    again after each test (tests/conftest.py)."""
    return testbed


def only_sshd(bed: Testbed, host) -> bool:
    """Nothing of ours left on the host: every live process in it is its sshd listener."""
    return bed.only_sshd(host)


def left_on(bed: Testbed, hosts) -> Callable[[], str]:
    """What a failed wait for only_sshd says: what else still runs on each host."""
    return lambda: (
        "only sshd on every host; left: " + bed.describe_left([bed.host(h) for h in hosts])
    )


def launch(ftrun, bed: Testbed, *flags: str, steps: int = 60, ckpt: Path):
    proc = ftrun.start(
        "launch",
        "--ssh-config",
        str(bed.ssh_config),
        *flags,
        TOY,
        "--steps",
        str(steps),
        "--step-time",
        "0.05",
        "--ckpt-dir",
        str(ckpt),
        "--ckpt-every",
        "5",
    )
    return proc, Output(proc)


def kinds(events, kind):
    return [e for e in events if e["kind"] == kind]


def through_a_power_loss(
    ftrun, bed: Testbed, tmp_path: Path, *policy: str, steps: int, victim: str
):
    """ftrun.checkpoint's test script on node1..3 under `policy`, a snapshot every step and
    nothing persisted after the first save, `victim` powered off at step 15; the job must
    finish. Returns its output, its journal and the newest step a rank recorded."""
    record = tmp_path / "record"
    record.mkdir()
    proc = ftrun.start(
        "launch", "--ssh-config", str(bed.ssh_config), "--hosts", "node1,node2,node3", *policy,
        CKPT_TRAIN, "--steps", str(steps), "--step-time", "0.1", "--memory-slots", "3",
        "--persist-every", "100000", "--record", str(record),
    )  # fmt: skip
    out = Output(proc)
    out.wait_for("[rank0]: LOSS rank=0 step=15 ", 120)
    bed.kill(victim)
    assert proc.wait(timeout=120) == 0, out.text()
    events = ftrun.events(ftrun.job_id())
    failed_at = max(step for r in range(3) for step, _ in recorded_steps(record, r))
    return out, events, failed_at


def test_at_step_on_a_host_whose_ranks_report_no_step_waits_for_the_jobs_step(ftrun, bed):
    """Only rank 0, on node1, prints the line --progress-regex reads: node2's agent sees no
    step, so the controller holds "kill rank 1 at step 40" until the job's step is 40."""
    proc = ftrun.start(
        "launch", "--ssh-config", str(bed.ssh_config), "--hosts", "node1,node2",
        "--progress-regex", r"^step (\d+)$", str(BIN / "plain_loop.py"), "--steps", "150",
        "--interval", "0.05", "--print-rank", "0",
    )  # fmt: skip
    out = Output(proc)
    out.wait_for("[rank0]: step 3", 120)
    job_id = ftrun.job_id()
    result = ftrun.run("chaos", job_id, "kill-rank", "--rank", "1", "--at-step", "40", timeout=30)
    assert result.returncode == 0, result.stderr
    assert proc.wait(timeout=90) == 0, out.text()
    [fault] = kinds(ftrun.events(job_id), "fault_detected")
    assert (fault["rank"], fault["host"], fault.get("injected")) == (1, "node2", "kill-rank")
    assert fault["step"] >= 40, fault


# Rank 1 finishes at once; rank 0 goes on until the test has taken rank 1's host away.
FINISHES_FIRST = """
import os, sys, time
for step in range(1, 11):
    print(f"step {step}", flush=True)
if os.environ["RANK"] == "0":
    deadline = time.monotonic() + 90
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def test_a_host_lost_after_its_ranks_exited_0_fails_nothing(ftrun, bed, tmp_path):
    """A Slurm node released, a spot machine reclaimed, as the job ends: its ranks' work is
    done, so losing it is no fault, and the job succeeds when the others finish."""
    script, marker = tmp_path / "finishes_first.py", tmp_path / "node2-gone"
    script.write_text(FINISHES_FIRST)
    proc = ftrun.start(
        "launch", "--ssh-config", str(bed.ssh_config), "--hosts", "node1,node2", str(script),
        str(marker),
    )  # fmt: skip
    out = Output(proc)
    job_id = ftrun.job_id(60)
    wait_for(lambda: kinds(ftrun.events(job_id), "exit_barrier"), 90, "rank 1 to exit 0")
    bed.kill("node2")
    wait_for(lambda: kinds(ftrun.events(job_id), "host_lost_after_finishing"), 30, "the loss")
    marker.write_text("")
    assert proc.wait(timeout=60) == 0, out.text()
    job = ftrun.only_job()
    assert (job["state"], job["incidents"]) == ("succeeded", []), job
    [lost] = kinds(ftrun.events(job_id), "host_lost_after_finishing")
    assert lost["host"] == "node2"


def test_killed_host_is_replaced_by_the_spare(ftrun, bed, tmp_path):
    proc, out = launch(
        ftrun, bed, "--hosts", "node1,node2,node3", "--spares", "node4", ckpt=tmp_path
    )
    out.wait_for("[rank2]: STEP 10 ", 120)
    fault_t = time.time()
    bed.kill("node3")
    assert proc.wait(timeout=120) == 0, out.text()
    job = ftrun.only_job()
    events = ftrun.events(job["job_id"])
    [detected] = kinds(events, "fault_detected")
    assert (detected["fault"], detected["host"]) == ("host-lost", "node3")
    assert detected["t"] - fault_t <= 1.5
    [change] = kinds(events, "hosts_changed")
    assert (change["how"], change["removed"], change["added"]) == ("replaced", ["node3"], ["node4"])
    launched = kinds(events, "generation_launched")
    assert [g["hosts"] for g in launched] == [
        ["node1", "node2", "node3"],
        ["node1", "node2", "node4"],
    ]
    assert [g["world_size"] for g in launched] == [3, 3]
    assert "resumed from step" in out.text()
    first_again = [e for e in kinds(events, "first_step") if e["gen"] == 2][0]
    assert first_again["t"] - fault_t < 20  # the benchmark measures this; here: it happened
    assert "WORLD 3 rank 2 on node4" in out.text()
    # The rank logs of every host, the spare's too, are in the controller's job directory.
    assert "STEP" in (ftrun.run_dir / job["job_id"] / "logs" / "g2" / "rank2.log").read_text()


def test_a_spare_restores_the_lost_hosts_ranks_from_its_peers_memory(ftrun, bed, tmp_path):
    """node2 (node rank 1) is powered off, its memory gone: the spare node4 takes its node rank
    and fetches its rank's snapshots from the replica node3 kept, and every rank restores from
    memory, a snapshot or two behind, while storage holds only the first step."""
    out, events, failed_at = through_a_power_loss(
        ftrun, bed, tmp_path, "--spares", "node4", steps=60, victim="node2"
    )
    launched = kinds(events, "generation_launched")
    assert [g["hosts"] for g in launched] == [
        ["node1", "node2", "node3"],
        ["node1", "node4", "node3"],  # the spare in the lost host's place: the others keep theirs
    ]
    [fetched] = kinds(events, "peer_fetched")
    assert (fetched["gen"], fetched["host"], fetched["which"]) == (2, "node4", "replica")
    assert fetched["ranks"] == [1] and fetched["error"] is None and fetched["snapshots"], fetched
    [restored] = [e for e in kinds(events, "checkpoint_restored") if e["gen"] == 2]
    assert restored["tier"] == "memory", restored
    assert failed_at - 3 <= restored["step"] <= failed_at, (restored, failed_at)
    # Every loss printed again after the restore is the one printed before it (exact resume).
    losses: dict[tuple[str, str], str] = {}
    for rank, step, loss in re.findall(r"LOSS rank=(\d+) step=(\d+) loss=(\S+)", out.text()):
        assert losses.setdefault((rank, step), loss) == loss, (rank, step)
    assert ("1", "60") in losses


def test_without_a_spare_the_job_shrinks_then_grows_back(ftrun, bed, tmp_path):
    proc, out = launch(
        ftrun, bed, "--hosts", "node1,node2,node3", "--min-nodes", "2", steps=100000, ckpt=tmp_path
    )
    out.wait_for("[rank2]: STEP 10 ", 120)
    bed.kill("node3")
    out.wait_for("WORLD 2 rank 1 on node2", 60)
    job_id = ftrun.job_id()
    # The host powers on again: the controller's retries reach it, and the job grows back.
    bed.start("node3")
    out.wait_for("WORLD 3 rank 2 on node3", 90)
    wait_for(
        lambda: any(e["kind"] == "first_step" and e["gen"] == 3 for e in ftrun.events(job_id)),
        60,
        "generation 3 to step",
    )
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    events = ftrun.events(job_id)
    assert [g["world_size"] for g in kinds(events, "generation_launched")] == [3, 2, 3]
    [change] = kinds(events, "hosts_changed")
    assert (change["how"], change["removed"], change["nodes_after"]) == ("shrunk", ["node3"], 2)
    [grow] = kinds(events, "reconfigure")
    assert grow["why"] == "grow" and "node3" in grow["detail"]


def test_a_shrink_restores_from_the_survivors_memory_not_storage(ftrun, bed, tmp_path):
    """No spare: node3 is powered off and the job goes on with 2 ranks. The new layout matches
    no snapshot, but each survivor's host holds its old rank's (data parallel: the whole model):
    every rank restores from memory a step or so behind, while storage holds only the first
    step (before, they restored step 0)."""
    out, events, failed_at = through_a_power_loss(
        ftrun, bed, tmp_path, "--min-nodes", "2", steps=40, victim="node3"
    )
    assert [g["world_size"] for g in kinds(events, "generation_launched")] == [3, 2]
    [restored] = [e for e in kinds(events, "checkpoint_restored") if e["gen"] == 2]
    assert restored["tier"] == "memory", restored
    assert failed_at - 3 <= restored["step"] <= failed_at, (restored, failed_at)
    assert "saved in another layout (3 ranks, now 2); per-rank state" in out.text()
    assert sorted(re.findall(r"RESTORED rank=(\d) step=\d+ tier=memory", out.text())) == ["0", "1"]


def test_a_removed_host_shrinks_from_memory_and_its_return_persists_first(ftrun, bed, tmp_path):
    """node3 is removed: the 2 left restore from their own memory. It is added back: its
    agent fetches an old node's rank snapshots from that node's memory before its rank starts,
    so every rank restores from memory; the grow also asks for a persist first (nothing has been
    persisted since the first save), in case that fetch comes back empty."""
    proc = ftrun.start(
        "launch", "--ssh-config", str(bed.ssh_config), "--hosts", "node1,node2,node3",
        "--min-nodes", "2", CKPT_TRAIN, "--steps", "150", "--step-time", "0.1",
        "--persist-every", "100000",
    )  # fmt: skip
    out = Output(proc)
    out.wait_for("[rank0]: LOSS rank=0 step=15 ", 120)
    job_id = ftrun.job_id()
    assert ftrun.run("hosts", job_id, "remove", "node3").returncode == 0
    wait_for(
        lambda: any(e["kind"] == "first_step" and e["gen"] == 2 for e in ftrun.events(job_id)),
        60,
        "generation 2 to step",
    )
    assert ftrun.run("hosts", job_id, "add", "node3").returncode == 0
    assert proc.wait(timeout=120) == 0, out.text()
    events = ftrun.events(job_id)
    assert [g["world_size"] for g in kinds(events, "generation_launched")] == [3, 2, 3]
    assert [r["why"] for r in kinds(events, "reconfigure")] == ["remove", "grow"]
    restored = {e["gen"]: e for e in kinds(events, "checkpoint_restored")}
    assert restored[2]["tier"] == "memory" and restored[2]["step"] >= 15, restored[2]
    [asked] = kinds(events, "persist_requested")
    [committed] = kinds(events, "persist_committed")
    assert (asked["gen"], asked["why"], committed["gen"]) == (2, "grow", 2)
    assert committed["step"] is not None and committed["step"] >= asked["step"], committed
    # node3, joining at node rank 2 of a job that ran on 2, fetched old node 0's rank (node1's)
    # from node1's memory, where the survivors keep the step the grow committed.
    [fetched] = kinds(events, "peer_fetched")
    assert (fetched["gen"], fetched["host"], fetched["which"]) == (3, "node3", "primary")
    assert fetched["ranks"] == [0] and fetched["error"] is None, fetched
    assert fetched["snapshots"] == [[0, committed["step"], 2]], fetched  # the newest only
    assert (restored[3]["step"], restored[3]["tier"]) == (committed["step"], "memory"), restored
    assert not kinds(events, "fault_detected")


def test_hosts_remove_and_add_from_the_command_line(ftrun, bed, tmp_path):
    proc, out = launch(ftrun, bed, "--hosts", "node1,node2", ckpt=tmp_path, steps=100000)
    out.wait_for("[rank1]: STEP 3 ", 120)
    job_id = ftrun.job_id()
    removed = ftrun.run("hosts", job_id, "remove", "node2")
    assert removed.returncode == 0 and "removed node2 (active)" in removed.stderr
    out.wait_for("WORLD 1 rank 0 on node1", 60)
    wait_for(lambda: only_sshd(bed, "node2"), 15, "node2 to be left alone")
    again = ftrun.run("hosts", job_id, "remove", "node2")
    assert again.returncode == 2 and "not part of the job" in again.stderr
    assert ftrun.run("hosts", job_id, "add", "node2").returncode == 0
    wait_for(
        lambda: len(kinds(ftrun.events(job_id), "generation_launched")) == 3,
        60,
        "the job to grow back onto node2",
    )
    out.wait_for("WORLD 2 rank 1 on node2", 60)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    events = ftrun.events(job_id)
    assert [r["why"] for r in kinds(events, "reconfigure")] == ["remove", "grow"]
    assert [g["hosts"] for g in kinds(events, "generation_launched")] == [
        ["node1", "node2"],
        ["node1"],
        ["node1", "node2"],
    ]
    assert not kinds(events, "fault_detected")  # planned changes are not incidents


def test_a_partitioned_host_trains_on_but_is_fenced_off(ftrun, bed, tmp_path):
    """node1 is cut off from the controller but not from the shared storage or /dev/shm, and
    its agent's fence timeout is 60 s: its ranks train on, a zombie generation. The controller
    relaunches on the spare at once; generation 2 claims the checkpoint directories, the
    zombie's next save is refused and it stops, no checkpoint of generation 1 is committed after
    generation 2 restored, and nothing the zombie says reaches the job once the link is back."""
    record = tmp_path / "record"
    record.mkdir()
    proc = ftrun.start(
        "launch",
        "--ssh-config",
        str(bed.ssh_config),
        "--hosts",
        "node1",
        "--spares",
        "node2",
        "--nproc-per-node",
        "2",
        "--fence-timeout",
        "60",
        CKPT_TRAIN,
        "--steps",
        "150",
        "--step-time",
        "0.05",
        # The zombie must still be training when generation 2 claims the directories: at 0.05 s
        # a step it could finish its 150 before a loaded machine's relaunch (seen in CI).
        "--first-generation-step-time",
        "0.2",
        "--keep",
        "1000",
        "--record",
        str(record),
    )
    out = Output(proc)
    out.wait_for("[rank1]: LOSS rank=1 step=10 ", 120)
    job_id = ftrun.job_id()
    bed.cut("node1")
    wait_for(lambda: kinds(ftrun.events(job_id), "first_step")[1:], 60, "generation 2's first step")

    def zombie_said() -> str:
        return "the zombie's save to be refused; it recorded: " + " | ".join(
            f"{p.name}: {p.read_text().splitlines()[-2:]}" for p in sorted(record.glob("g1-r*"))
        )

    wait_for(
        lambda: any("SUPERSEDED" in p.read_text() for p in record.glob("g1-r*.txt")),
        30,
        zombie_said,
    )
    bed.heal("node1")  # what the zombie's agent still has to say now reaches the controller
    assert proc.wait(timeout=120) == 0, out.text()

    events = ftrun.events(job_id)
    launched = kinds(events, "generation_launched")
    assert [g["hosts"] for g in launched][:2] == [["node1"], ["node2"]]
    assert not kinds(events, "fence_wait")
    relaunched_t = launched[1]["t"]
    zombie = [line.split() for p in record.glob("g1-r*.txt") for line in p.read_text().splitlines()]
    # The zombie was alive and training when generation 2 was launched: nobody waited for it.
    assert [w for w in zombie if w[0] == "STEP" and float(w[2]) > relaunched_t], zombie[-4:]
    [refused, *_] = [w for w in zombie if w[0] == "SUPERSEDED"]
    assert " ".join(refused[3:]).find("generation 2 has claimed") > 0, refused
    # Nothing of generation 1 was committed after generation 2 restored: every generation-1
    # checkpoint is one generation 2 could have restored from.
    [restored] = [e for e in kinds(events, "checkpoint_restored") if e["gen"] == 2]
    committed = {}
    for manifest in (ftrun.run_dir / job_id / "checkpoints").glob("step-*/manifest.json"):
        body = json.loads(manifest.read_text())
        committed.setdefault(body["generation"], []).append(body["step"])
    assert committed[1] and max(committed[1]) <= restored["step"] < min(committed[2])
    assert max(committed[2]) == 150, out.text()[-3000:]  # generation 2 ran to the end
    # Nothing the zombie said after generation 2 began was taken for the job.
    assert not [
        e
        for e in events
        if e["t"] > relaunched_t and e.get("host") == "node1" and e.get("gen") == 1
    ]


def test_a_resumed_controller_adopts_the_generation_on_ssh_hosts(ftrun, bed, tmp_path):
    """The controller is SIGKILLed: its ssh sessions die with it, and the agents keep their
    ranks training, dialling it again. `ftrun resume` comes up within their grace, on the same
    port, secret and certificate (TLS between hosts), and adopts the generation: the same rank
    processes, every step once. The spare's agent dials back too and is kept as the spare.
    No standby: with one, it would take the job over before a person could resume it."""
    record = tmp_path / "record"
    record.mkdir()
    proc = ftrun.start(
        "launch",
        "--ssh-config",
        str(bed.ssh_config),
        "--hosts",
        "node1,node2",
        "--spares",
        "node3",
        "--no-standby",
        CKPT_TRAIN,
        "--steps",
        "120",
        "--step-time",
        "0.05",
        "--record",
        str(record),
    )
    out = Output(proc)
    out.wait_for("[rank1]: LOSS rank=1 step=8 ", 120)
    job_id = ftrun.job_id()
    kill_and_adopt(ftrun, proc, job_id, record, hosts="node1, node2", steps=120)
    events = ftrun.events(job_id)
    spare = [e["agent"] for e in kinds(events, "agent_connected") if e["host"] == "node3"]
    assert spare == ["node3#1", "node3#1"], "connected at the launch, and again to the resume"
    assert not [e for e in kinds(events, "host_unreachable") if e["host"] == "node3"]


def test_unreachable_host_at_start_is_replaced_or_fails_the_launch(ftrun, bed, tmp_path):
    nowhere = bed.subnet.rsplit(".", 1)[0] + ".99"  # in the testbed's /24, no host there
    proc, out = launch(
        ftrun, bed, "--hosts", f"node1,{nowhere}", "--spares", "node2", ckpt=tmp_path, steps=10
    )
    assert proc.wait(timeout=120) == 0, out.text()
    events = ftrun.events(ftrun.job_id())
    [unreachable] = [e for e in kinds(events, "host_unreachable") if not e["retry"]]
    assert unreachable["host"] == nowhere and "Unable to connect" in unreachable["error"]
    assert kinds(events, "generation_launched")[0]["hosts"] == ["node1", "node2"]

    result = ftrun.run(
        "launch",
        "--ssh-config",
        str(bed.ssh_config),
        "--hosts",
        f"node1,{nowhere}",
        "--min-nodes",
        "2",
        TOY,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"cannot reach {nowhere} over ssh" in result.stderr
    assert "fewer than --min-nodes 2" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("how", ["ctrl-c", "controller-killed"])
def test_teardown_reaches_every_host(ftrun, bed, tmp_path, how):
    # Killed, the controller leaves agents that fence: at once without a grace (with one they
    # wait for `ftrun resume`: test_a_resumed_controller_adopts_the_generation_on_ssh_hosts).
    grace = ("--controller-grace", "0") if how == "controller-killed" else ()
    proc, out = launch(
        ftrun, bed, "--hosts", "node1,node2,node3", *grace, ckpt=tmp_path, steps=100000
    )
    out.wait_for("[rank2]: STEP 3 ", 120)
    assert not only_sshd(bed, "node2")
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    else:
        proc.kill()  # the remote agents see their stdin and connection close, and fence
        proc.wait(timeout=10)
    wait_for(
        lambda: all(only_sshd(bed, h) for h in ("node1", "node2", "node3")),
        15,
        left_on(bed, ("node1", "node2", "node3")),
    )


def test_contract_and_user_env_reach_the_ranks_of_every_host(ftrun, bed, tmp_path, test_id):
    """The torchrun contract per host (GROUP_RANK is the node rank) in two generations, and
    --env/--env-file values on every host, never on a command line there."""
    secret = "sk-" + test_id
    env_file = tmp_path / "job.env"
    env_file.write_text(f"WANDB_API_KEY={secret}\nDATA_DIR='/data/odd path'\n")
    proceed = tmp_path / "proceed"
    proc = ftrun.start(
        "launch",
        "--ssh-config",
        str(bed.ssh_config),
        "--hosts",
        "node1,node2",
        "--nproc-per-node",
        "2",
        "--env-file",
        str(env_file),
        "--env",
        "X=1",
        str(BIN / "contract.py"),
        "--fail-once",
        str(tmp_path / "failed-once"),
        "--wait-for",
        str(proceed),
        "--names",
        "WANDB_API_KEY",
        "DATA_DIR",
        "X",
    )
    out = Output(proc)
    # Each wait ends before the test's own timeout (120 s), so that a failure says what the job
    # printed. (Seen twice under load: rank 3 printed in generation 2 only, because rank 1 ended
    # generation 1 before rank 3 had printed; contract.py's rank 1 now waits for every rank.)
    for rank in range(4):
        out.wait_for(f"[rank{rank}]: CONTRACT", 60)
    for rank in range(4):
        wait_for(
            lambda rank=rank: sum(f"[rank{rank}]: CONTRACT" in line for line in out.lines) == 2,
            30,
            lambda rank=rank: f"rank {rank} of generation 2 in: {''.join(out.lines)[-4000:]}",
        )
    try:
        leaks = [
            pid
            for host in ("node1", "node2")
            for pid in bed.pids(host)
            if secret in " ".join(_cmdline(pid))
        ]
    finally:
        proceed.touch()
    assert proc.wait(timeout=120) == 0, out.text()
    assert leaks == []
    job_id = ftrun.job_id()
    seen = [json.loads(line.split("CONTRACT ", 1)[1]) for line in out.lines if "CONTRACT " in line]
    assert len(seen) == 8, out.text()
    for env in seen:
        assert env["GROUP_RANK"] == str(int(env["RANK"]) // 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["TORCHELASTIC_RESTART_COUNT"] == str(int(env["FTRUN_GENERATION"]) - 1)
        assert env["TORCHELASTIC_RUN_ID"] == job_id
        assert (env["WANDB_API_KEY"], env["DATA_DIR"], env["X"]) == (secret, "/data/odd path", "1")


@pytest.mark.parametrize("sig", ["TERM", "USR1"])
def test_signals_reach_the_ranks_of_every_host(ftrun, bed, tmp_path, sig):
    proc = ftrun.start(
        "launch",
        "--ssh-config",
        str(bed.ssh_config),
        "--hosts",
        "node1,node2",
        "--nproc-per-node",
        "2",
        "--term-timeout",
        "30",
        "--forward-signal",
        "USR1",
        str(BIN / "signals.py"),
        "--dir",
        str(tmp_path),
        "--save-s",
        "1",
        "--after-usr1",
        "10",
    )
    out = Output(proc)
    for rank in range(4):
        out.wait_for(f"[rank{rank}]: step 3", 120)
    proc.send_signal(getattr(signal, f"SIG{sig}"))
    assert proc.wait(timeout=60) == (130 if sig == "TERM" else 0), out.text()
    marker = "saved" if sig == "TERM" else "usr1"
    assert sorted(p.name for p in tmp_path.glob(f"{marker}-rank*")) == [
        f"{marker}-rank{r}" for r in range(4)
    ]
    wait_for(
        lambda: all(only_sshd(bed, h) for h in ("node1", "node2")),
        15,
        left_on(bed, ("node1", "node2")),
    )


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def _inspect(ftrun, job_id):
    import json

    result = ftrun.run("inspect", job_id, "--json", timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_exit_barrier_spans_hosts(ftrun, bed):
    """Rank 0 on node1 exits 0, rank 1 on node2 never exits: the deadline is the controller's,
    node2's agent sends the stacks, the job ends with exit 0 and an exit_hang incident, and
    nothing is left on either host."""
    result = ftrun.run(
        "launch",
        "--ssh-config",
        str(bed.ssh_config),
        "--hosts",
        "node1,node2",
        "--exit-timeout",
        "3",
        str(BIN / "exit_hang.py"),
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = _inspect(ftrun, ftrun.status_json()[0]["job_id"])
    [inc] = job["incidents"]
    assert (inc["kind"], inc["rank"], inc["host"], inc["clean_rank"]) == (
        "exit_hang",
        1,
        "node2",
        0,
    )
    assert "exit_hang.py" in inc["stacks"]["1"] and inc["stacks_missing_from"] == []
    [asked] = kinds(job["events"], "stacks_requested")
    # node2 holds the live rank. node1 may be asked too: its rank is done, but its torchrun is
    # still in torchrun's own exit barrier, waiting for node2's.
    assert "node2" in asked["hosts"]
    wait_for(
        lambda: all(only_sshd(bed, h) for h in ("node1", "node2")),
        15,
        "both hosts to be back to just their sshd",
    )


def test_idle_guard_needs_every_host(ftrun, bed):
    """One rank per host. Rank 0 on node1 burns CPU silently while rank 1 on node2 sleeps:
    node2 alone is idle, the job is not. Then both sleep: a hang, with both hosts' stacks."""
    common = ("launch", "--ssh-config", str(bed.ssh_config), "--hosts", "node1,node2")
    # node2 is idle for 4 s (the spin and a second more): four idle windows, and node2 reports
    # itself idle after a quarter of one (agent/idle.py), so only node1's CPU keeps the job busy.
    result = ftrun.run(
        *common,
        "--idle-timeout",
        "1",
        str(BIN / "silent.py"),
        "--mode",
        "spin",
        "--seconds",
        "3",
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    busy = ftrun.only_job()
    assert busy["state"] == "succeeded" and busy["incidents"] == []
    result = ftrun.run(
        *common, "--idle-timeout", "2", "--max-restarts", "0", str(BIN / "silent.py"), timeout=180
    )
    assert result.returncode == 1, result.stdout + result.stderr
    [idle_job] = [j for j in ftrun.status_json() if j["job_id"] != busy["job_id"]]
    [inc] = _inspect(ftrun, idle_job["job_id"])["incidents"]
    assert inc["kind"] == "hang" and inc["idle_s"] >= 2 and set(inc["stacks"]) == {"0", "1"}
