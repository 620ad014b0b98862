"""The control plane between hosts is TLS pinned to the controller's throwaway certificate
(ftrun/tls.py): a real agent connects and says hello through it; a client that speaks plain
TCP, or an agent that was handed another certificate, gets nowhere."""

from __future__ import annotations

import asyncio

from ftrun import tls
from ftrun.controller.server import ControlServer
from ftrun.wire import protocol
from ftrun.wire.inbound import Hello
from tests.conftest import spawn_agent


def boot(port: int, secret: str, cert: str) -> dict:
    return {
        "controller_host": "127.0.0.1",
        "controller_port": port,
        "secret": secret,
        "job_id": "j",
        "agent_id": "a#0",
        "host": "a",
        "heartbeat_interval_s": 0.1,
        "fence_timeout_s": 3.0,
        "warm_start": False,
        "controller_cert": cert,
    }


def test_agents_speak_tls_pinned_to_the_controllers_certificate(tmp_path, test_id, no_survivors):
    identity = tls.new_identity()

    async def scenario() -> tuple[str, bool, int]:
        server = ControlServer(
            protocol.new_secret(),
            expected_agents={"a#0"},
            heartbeat_interval_s=0.1,
            host_lost_timeout_s=5.0,
        )
        port = await server.start(tls=tls.server_context(identity, tmp_path))
        try:
            # An agent handed a different certificate refuses the controller: it never says hello.
            impostor_cert = tls.new_identity().cert_pem
            wrong = await spawn_agent(
                boot(port, server.secret, impostor_cert), tmp_path / "w.log", test_id
            )
            wrong_code = await asyncio.wait_for(wrong.wait(), 30)
            # Plain TCP to a TLS controller: no nonce, the connection is closed.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"\0" * 64)
            plain_refused = await asyncio.wait_for(reader.read(100), 10) == b""
            writer.close()
            # The real thing: hello over TLS.
            agent = await spawn_agent(
                boot(port, server.secret, identity.cert_pem), tmp_path / "a.log", test_id
            )
            sender, hello = await asyncio.wait_for(server.inbox.get(), 30)
            server.send(sender, "shutdown")
            code = await asyncio.wait_for(agent.wait(), 30)
            assert code == 0
            return hello, plain_refused, wrong_code
        finally:
            await server.close()

    hello, plain_refused, wrong_code = asyncio.run(scenario())
    assert isinstance(hello, Hello) and hello.KIND == "hello"
    assert plain_refused
    assert wrong_code != 0
    assert "CERTIFICATE_VERIFY_FAILED" in (tmp_path / "w.log").read_text()
    assert list(tmp_path.glob(".tls-*")) == []  # the key file was removed once loaded
