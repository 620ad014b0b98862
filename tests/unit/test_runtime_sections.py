"""ftrun.section as the agent receives it: the datagrams a rank sends (ftrun/runtime.py)."""

from __future__ import annotations

import json
import socket

import pytest

from ftrun import runtime
from ftrun.envcontract import AGENT_SOCK


@pytest.fixture
def agent(tmp_path, monkeypatch):
    """A datagram socket where the agent's would be, and the runtime pointed at it."""
    path = str(tmp_path / "agent.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    monkeypatch.setenv(AGENT_SOCK, path)
    monkeypatch.setattr(runtime, "_target", runtime._UNSET)
    yield lambda: json.loads(sock.recv(65536))
    runtime._target = runtime._UNSET
    sock.close()


def test_leaving_an_inner_section_declares_the_outer_one_again(agent):
    """Manager.close() declares a section of its own; called inside the user's, it must not
    end theirs: the rest of the user's section would be held to the step allowance."""
    with runtime.section("final save", timeout_s=600):
        with runtime.section("checkpoint close", timeout_s=120):
            pass
        assert runtime._open_sections[-1]["name"] == "final save"
    seen = [agent() for _ in range(4)]
    assert [(m["name"], m["begin"], m.get("timeout")) for m in seen] == [
        ("final save", True, 600),
        ("checkpoint close", True, 120),
        ("final save", True, 600),  # declared again on leaving the inner one
        ("final save", False, None),
    ]
    assert runtime._open_sections == []
