"""The warm interpreter's bookkeeping of its children (ftrun/agent/zygote.py)."""

from __future__ import annotations

import os
import socket
import subprocess

from ftrun.agent.zygote import Zygote


def test_a_child_reaped_in_the_same_batch_as_its_hangup_is_not_an_error(tmp_path):
    """A child that exits closes its connection too, so select() can return its pidfd and its
    connection in one batch: the hangup, handled after the reap, must find nothing to do (it
    raised KeyError, and the zygote printed a traceback into the agent's log)."""
    zygote = Zygote(str(tmp_path / "zygote.sock"))
    child = subprocess.Popen(["true"])
    ours, theirs = socket.socketpair()
    pidfd = os.pidfd_open(child.pid)
    zygote.children[child.pid] = (ours, pidfd)
    theirs.close()
    child_status = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert child_status is not None
    zygote._reap(child.pid)
    zygote._on_conn(child.pid)
    assert zygote.children == {}
    assert ours.fileno() == -1  # closed by the reap
    zygote.listener.close()
