"""A real agent, talking to a hostile controller: garbage, tampered, replayed, oversized and
stale-generation messages are dropped and logged, and the agent keeps heartbeating."""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys

from ftrun.wire import protocol
from tests.conftest import spawn_agent


def test_agent_survives_malformed_messages(tmp_path, test_id, no_survivors):
    secret = protocol.new_secret()
    log_path = tmp_path / "agent.log"

    async def scenario() -> tuple[int, int]:
        connected: asyncio.Queue = asyncio.Queue()

        async def on_connect(reader, writer):
            await connected.put(await protocol.accept_channel(reader, writer, secret))

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        boot = {
            "controller_host": "127.0.0.1",
            "controller_port": port,
            "secret": secret,
            "job_id": "j",
            "agent_id": "a#0",
            "host": "a",
            "heartbeat_interval_s": 0.1,
            "fence_timeout_s": 5.0,
            "warm_start": False,
        }
        agent = await spawn_agent(boot, log_path, test_id)
        chan = await asyncio.wait_for(connected.get(), 10)
        hello = await asyncio.wait_for(chan.receive(), 10)
        assert hello["kind"] == "hello" and hello["agent_id"] == "a#0"

        chan.send("heartbeat")
        good = protocol.encode(
            {"v": protocol.VERSION, "kind": "heartbeat", "seq": 1}, chan._send_key
        )
        chan.writer.write(good)  # replayed: seq 1 again
        chan.writer.write(struct.pack("!I", 40) + b"\x01" * 40)  # bad tag
        bad_version = protocol.encode({"v": 99, "kind": "launch", "seq": 50}, chan._send_key)
        chan.writer.write(bad_version)
        chan._sent_seq = 60
        chan.send("launch_me_not")  # unknown kind: ignored
        chan.send("stop", gen=12345, grace_s=0)  # a generation that does not exist
        chan.send("inject", gen=777, action="kill-agent")  # stale: must not kill the agent
        await chan.drain(10.0)

        beats = 0
        while beats < 10:  # the agent keeps heartbeating after all that
            msg = await asyncio.wait_for(chan.receive(), 5)
            beats += msg["kind"] == "heartbeat"
        chan.send("shutdown")
        await chan.drain(10.0)
        code = await asyncio.wait_for(agent.wait(), 10)
        server.close()
        return beats, code

    beats, code = asyncio.run(scenario())
    assert beats == 10 and code == 0
    log = log_path.read_text()
    assert "replayed" in log and "authentication" in log and "version" in log


def test_agent_with_bad_bootstrap_exits_cleanly(no_survivors, test_id):
    out = subprocess.run(
        [sys.executable, "-m", "ftrun.agent"],
        input="{not json\n",
        text=True,
        capture_output=True,
        timeout=30,
        env={**os.environ, "FTRUN_TEST_ID": test_id},
    )
    assert out.returncode == 2 and "bad bootstrap" in out.stderr and "Traceback" not in out.stderr
