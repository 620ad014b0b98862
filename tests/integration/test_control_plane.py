"""Garbage aimed at a live controller's port and a live agent's rank socket is dropped and logged;
the job trains on and stops cleanly."""

from __future__ import annotations

import signal
import socket
import struct

from tests.conftest import BIN, Output, wait_for


def test_malformed_messages_never_crash_controller_or_agent(ftrun):
    proc = ftrun.start("launch", str(BIN / "sleeper.py"))
    out = Output(proc)
    try:
        out.wait_for("[rank0]: step 2")
        job_id = ftrun.status_json()[0]["job_id"]
        port = next(e["control_port"] for e in ftrun.events(job_id) if e["kind"] == "job_started")
        attacks = [
            b"GET / HTTP/1.0\r\n\r\n",  # not our protocol at all
            struct.pack("!I", 64) + b"\x00" * 64,  # a frame with a bad tag
            struct.pack("!I", 1 << 30),  # an oversized frame
            struct.pack("!I", 100) + b"short",  # a truncated frame, then the connection closes
        ]
        for attack in attacks:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.recv(16)  # the server's nonce
                s.sendall(attack)
        agent_sock = next(
            line.split("agent socket ", 1)[1].strip()
            for line in out.lines
            if "agent socket" in line
        )
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            for datagram in (
                b"\xff\xfe garbage",
                b'{"e":"step"}',
                b'{"e":"step","g":99,"r":0,"s":5}',
                b"[]",
            ):
                s.sendto(datagram, agent_sock)
        seen = len(out.lines)
        wait_for(lambda: len(out.lines) > seen + 5, 10, "the ranks to keep training")
        assert ftrun.status_json(job_id)["state"] == "running"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
    log = (ftrun.run_dir / job_id / "controller.log").read_text()
    assert log.count("refused a connection") == len(attacks)
    agent_log = (ftrun.run_dir / job_id / "agents" / "localhost.log").read_text()
    assert "dropped a malformed datagram" in agent_log


def test_authenticated_but_stale_agents_are_refused(ftrun):
    """Even with the job secret, an agent id that is not a host's current agent (an old
    incarnation, or a second copy of a live one) cannot join: nothing it says is taken."""
    import asyncio
    import json

    from ftrun.wire.protocol import open_channel

    proc = ftrun.start("launch", str(BIN / "sleeper.py"))
    out = Output(proc)
    try:
        out.wait_for("[rank0]: step 2")
        job_id = ftrun.status_json()[0]["job_id"]
        control = json.loads((ftrun.run_dir / job_id / "control.json").read_text())

        async def pose_as(agent_id: str) -> bool:
            chan = await open_channel(control["host"], control["port"], control["secret"], 5)
            chan.send("hello", agent_id=agent_id, host="localhost", pid=1)
            chan.send("gen_exited", gen=1, exit_code=0)  # would end the job if it were taken
            await chan.drain(10.0)
            try:
                # Refused: told to fence (what an agent of ours dropped earlier must do), then
                # closed; nothing else comes back.
                while (msg := await asyncio.wait_for(chan.receive(), 5))["kind"] == "fence":
                    assert agent_id in msg["reason"]
                return True
            except (asyncio.IncompleteReadError, ConnectionError):
                return False
            finally:
                chan.close()

        for impostor in ("localhost#1", "localhost#0", "localhost#2"):
            assert asyncio.run(pose_as(impostor)) is False, impostor
        seen = len(out.lines)
        wait_for(lambda: len(out.lines) > seen + 3, 10, "the ranks to keep training")
        assert ftrun.status_json(job_id)["state"] == "running"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
    log = (ftrun.run_dir / job_id / "controller.log").read_text()
    assert log.count("refused a connection") == 3
