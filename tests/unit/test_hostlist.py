"""Host lists and hostfiles as users write them (DeepSpeed/MPI convention)."""

from __future__ import annotations

import pytest

from ftrun.errors import UsageError
from ftrun.hostlist import (
    HostEntry,
    SshTarget,
    check_roles,
    parse_host_list,
    read_hostfile,
    split_target,
    uniform_slots,
)


@pytest.mark.parametrize(
    "text, target",
    [
        ("node1", SshTarget("node1")),
        ("alice@node1", SshTarget("node1", "alice")),
        ("alice@10.0.0.5:2222", SshTarget("10.0.0.5", "alice", 2222)),
        ("[fe80::1]:22", SshTarget("fe80::1", None, 22)),
    ],
)
def test_split_target(text, target):
    assert split_target(text) == target


def test_host_list_skips_empty_items():
    assert parse_host_list(" a, b,,c ") == [HostEntry("a"), HostEntry("b"), HostEntry("c")]


def test_hostfile_with_comments_slots_and_users(tmp_path):
    path = tmp_path / "host file"
    path.write_text("# workers\nworker-1 slots=8\n\n  bob@worker-2:2200 slots=8  # the second\n")
    entries = read_hostfile(path)
    assert entries == [HostEntry("worker-1", 8), HostEntry("bob@worker-2:2200", 8)]
    assert uniform_slots(entries) == 8


def test_every_hostfile_problem_in_one_message(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("good\nbad host! slots=x\nh:70000\nh2 gpus=4\n")
    with pytest.raises(UsageError) as e:
        read_hostfile(path)
    message = e.value.message
    assert f"{path}:2" in message and "slots must be" in message
    assert "port 70000" in message and "unknown field 'gpus=4'" in message


def test_missing_and_empty_hostfiles(tmp_path):
    with pytest.raises(UsageError, match="cannot read the hostfile"):
        read_hostfile(tmp_path / "nope")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(UsageError, match="names no host"):
        read_hostfile(tmp_path / "empty")


def test_roles_and_slots_are_checked():
    with pytest.raises(UsageError, match="named twice"):
        check_roles([HostEntry("a")], [HostEntry("a")], None)
    with pytest.raises(UsageError, match="--min-nodes must be in 1..1"):
        check_roles([HostEntry("a")], [], 2)
    with pytest.raises(UsageError, match="different slots"):
        uniform_slots([HostEntry("a", 2), HostEntry("b", 4)])
    assert uniform_slots([HostEntry("a"), HostEntry("b")]) is None


@pytest.mark.parametrize("text", ["node1\n", "alice@node1:22\n", "node1\nnode2"])
def test_a_trailing_line_break_is_not_part_of_a_host(text):
    """`$` matches before a final newline: the whole text must be the host (issue 34)."""
    with pytest.raises(UsageError, match="is not a host"):
        split_target(text)
