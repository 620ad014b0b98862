"""The GLIBC_TUNABLES ranks get (ftrun/agent/copy_tunables.py): lowered to 4 MiB only where
glibc's own threshold is higher, and never over the user's value."""

from __future__ import annotations

import subprocess
import sys

from ftrun.agent import copy_tunables
from ftrun.agent.copy_tunables import THRESHOLD, TUNABLE, tunables_for_ranks

HIGH = 181 << 20  # this project's VM: glibc derives it from a reported 480 MiB L3


def test_a_high_threshold_is_lowered_to_4_mib():
    assert tunables_for_ranks(None, HIGH) == f"{TUNABLE}=0x400000"
    assert tunables_for_ranks("", HIGH) == f"{TUNABLE}=0x400000"
    assert tunables_for_ranks(None, 26 << 20) == f"{TUNABLE}=0x400000"  # glibc 2.38: L3 / 4


def test_other_tunables_are_kept_and_the_threshold_is_appended():
    got = tunables_for_ranks("glibc.malloc.arena_max=2", HIGH)
    assert got == f"glibc.malloc.arena_max=2:{TUNABLE}=0x400000"


def test_never_raised_nor_set_where_glibc_already_streams_or_cannot_tell():
    assert tunables_for_ranks(None, THRESHOLD) is None
    assert tunables_for_ranks(None, 1 << 20) is None  # glibc 2.36 on an ordinary server
    assert tunables_for_ranks(None, None) is None


def test_the_users_value_wins_even_when_higher():
    assert tunables_for_ranks(f"glibc.malloc.arena_max=2:{TUNABLE}=0x20000000", HIGH) is None


def test_apply_sets_the_environment_it_is_given_only_when_lowering(monkeypatch):
    monkeypatch.setattr(copy_tunables, "glibc_threshold", lambda: HIGH)
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert copy_tunables.apply(env) == env["GLIBC_TUNABLES"]
    assert env["GLIBC_TUNABLES"].endswith(f"{TUNABLE}=0x400000")
    monkeypatch.setattr(copy_tunables, "glibc_threshold", lambda: 1 << 20)
    env = {}
    assert copy_tunables.apply(env) is None and env == {}


def test_glibc_threshold_is_what_the_loader_reports_to_a_process_started_with_the_value():
    threshold = copy_tunables.glibc_threshold()
    if threshold is None:  # not glibc >= 2.33 on x86-64: nothing to read, nothing set
        assert tunables_for_ranks(None, threshold) is None
        return
    value = f"{TUNABLE}={THRESHOLD:#x}"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ftrun.agent.copy_tunables import glibc_threshold; print(glibc_threshold())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"GLIBC_TUNABLES": value, "PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout
    assert int(out) == THRESHOLD
