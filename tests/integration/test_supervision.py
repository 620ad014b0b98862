"""Failures of ftrun's own tasks, with real agents and ranks: a controller loop that raises is
journaled and restarted; a bug in the supervise loop ends the job cleanly with it as the root
cause (no rank survives); an agent whose loop raises says so, restarts it and keeps working.

Faults are injected deterministically at a seam (a method that raises once), since a healthy
ftrun has no such bug to trigger from outside."""

from __future__ import annotations

import asyncio

from ftrun.config import LaunchConfig
from ftrun.controller.generation import GenWatch
from ftrun.controller.policy_file import FaultPolicy
from ftrun.controller.server import ControlServer
from ftrun.controller.supervisor import Supervisor
from ftrun.errors import EXIT_JOB_FAILED
from ftrun.journal import Journal
from ftrun.journal.read import read_events
from ftrun.transport.local import LocalTransport
from ftrun.wire import protocol
from ftrun.wire.inbound import Progress, RankStarted
from tests.conftest import BIN, spawn_agent


class Notes:
    def __init__(self) -> None:
        self.notices: list[str] = []

    def notice(self, text: str, *, level: str = "info") -> None:
        self.notices.append(text)

    def rank_output(self, rank: int, lines: list[str]) -> None:
        pass

    def torchrun_output(self, host: str, lines: list[str]) -> None:
        pass


def run_job(tmp_path, monkeypatch, test_id, *script_args: str):
    """The real supervisor in this process (so a test can plant a fault in it), with a real
    local agent and real ranks in subprocesses."""
    monkeypatch.setenv("FTRUN_TEST_ID", test_id)
    config = LaunchConfig(
        # One job id per test: with one for all ("sup-1" until 2026-11-26), two of these tests
        # on the two pytest workers ran two jobs whose agents had the same process tag
        # (job/agent id), so the first to end its generation SIGKILLed the other's agent and
        # ranks in its sweep: "host localhost was lost", twice in CI and once here.
        job_id=f"sup-{test_id[:12]}",
        job_name="sup",
        run_dir=tmp_path / "runs",
        script=str(BIN / "plain_loop.py"),
        script_args=script_args,
        progress_regex=r"^step (\d+)",
    )
    journal = Journal(config.job_dir)
    notes = Notes()
    supervisor = Supervisor(
        config,
        policy=FaultPolicy(),
        journal=journal,
        transport=LocalTransport(config.python),
        reporter=notes,
    )
    try:
        outcome = asyncio.run(asyncio.wait_for(supervisor.run(), 120))
    finally:
        journal.close()
    return outcome, read_events(config.job_dir), notes


def test_a_controller_loop_that_raises_is_journaled_and_restarted(
    tmp_path, monkeypatch, test_id, no_survivors
):
    original = ControlServer._heartbeat_loop
    calls = []

    async def raises_once(self):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected into the heartbeat check")
        await original(self)

    monkeypatch.setattr(ControlServer, "_heartbeat_loop", raises_once)
    # 5 s of steps: longer than the agents' fence timeout (3 s), so without the restart (no
    # heartbeats from the controller) the host would fence and the job fail.
    outcome, events, notes = run_job(
        tmp_path, monkeypatch, test_id, "--steps", "100", "--interval", "0.05"
    )
    assert outcome.state == "succeeded", (outcome, notes.notices)
    [failed] = [e for e in events if e["kind"] == "task_failed"]
    assert failed["task"] == "heartbeat check" and failed["restarting"] and not failed["fatal"]
    assert failed["error"] == "RuntimeError: injected into the heartbeat check"
    assert "raises_once" in failed["traceback"]
    assert len(calls) == 2 and not [e for e in events if e["kind"] == "fault_detected"]
    assert any("heartbeat check failed" in n and "restarting" in n for n in notes.notices)


def test_a_bug_in_the_supervise_loop_ends_the_job_with_it_as_root_cause(
    tmp_path, monkeypatch, test_id, no_survivors
):
    original = GenWatch.record_output

    def fails_on_a_rank(watch, host, msg):
        if isinstance(msg, (RankStarted, Progress)):
            raise KeyError("injected into the supervise loop")
        return original(watch, host, msg)

    monkeypatch.setattr(GenWatch, "record_output", fails_on_a_rank)
    # Ranks that would step for ever: the job must end by itself, and take them with it.
    outcome, events, notes = run_job(
        tmp_path, monkeypatch, test_id, "--steps", "1000000", "--interval", "0.05"
    )
    seen = [e for e in events if e["kind"] in ("agent_lost", "agent_slow", "controller_stalled")]
    assert (outcome.state, outcome.exit_code) == ("failed", EXIT_JOB_FAILED), seen
    assert outcome.reason == (
        "internal error: supervise loop failed (KeyError: 'injected into the supervise loop')"
    ), seen
    root = outcome.root_cause
    assert root["kind"] == "internal" and "fails_on_a_rank" in root["traceback"]
    [failed] = [e for e in events if e["kind"] == "task_failed"]
    assert failed["task"] == "supervise loop"
    assert events[-1]["kind"] == "job_finished" and events[-1]["root_cause"]["kind"] == "internal"


def test_an_agent_drops_an_ill_typed_order_and_reports_a_failed_launch(
    tmp_path, test_id, no_survivors
):
    secret = protocol.new_secret()
    log_path = tmp_path / "agent.log"

    async def scenario() -> tuple[list[dict], int]:
        connected: asyncio.Queue = asyncio.Queue()

        async def on_connect(reader, writer):
            await connected.put(await protocol.accept_channel(reader, writer, secret))

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        boot = {
            "controller_host": "127.0.0.1",
            "controller_port": server.sockets[0].getsockname()[1],
            "secret": secret,
            "job_id": "j",
            "agent_id": f"a#{test_id}",
            "host": "a",
            "heartbeat_interval_s": 0.1,
            "fence_timeout_s": 5.0,
            "warm_start": False,
        }
        agent = await spawn_agent(boot, log_path, test_id)
        chan = await asyncio.wait_for(connected.get(), 10)
        assert (await asyncio.wait_for(chan.receive(), 10))["kind"] == "hello"

        # Once raised in the receive loop itself; messages.py now drops it before it is read.
        chan.send("stop", gen=1, grace_s="soon")
        chan.send("launch", gen=7)  # raises in the launch: no nnodes, no entrypoint
        await chan.drain(10.0)
        said, beats = [], 0
        while beats < 10 or len(said) < 2:  # and it still hears us, and still heartbeats
            msg = await asyncio.wait_for(chan.receive(), 5)
            if msg["kind"] == "heartbeat":
                beats += 1
            else:
                said.append(msg)
        chan.send("shutdown")
        await chan.drain(10.0)
        code = await asyncio.wait_for(agent.wait(), 10)
        server.close()
        return said, code

    said, code = asyncio.run(scenario())
    assert code == 0
    errors = [m for m in said if m["kind"] == "agent_error"]
    assert [(e["task"], e["restarting"], e["fatal"]) for e in errors] == [("launch", False, False)]
    [gen_exited] = [m for m in said if m["kind"] == "gen_exited"]
    assert gen_exited["gen"] == 7 and "could not launch" in gen_exited["tail"][0]
    agent_log = log_path.read_text()
    assert "dropped a message from the controller: stop: field 'grace_s'" in agent_log
    assert "receive loop failed" not in agent_log
