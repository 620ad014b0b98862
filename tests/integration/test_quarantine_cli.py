"""`ftrun hosts --quarantined` and the quarantine store from the command line, as a user meets
them: listed with why and until when, cleared, a quarantined host refused by `hosts add` with
the way out, and a broken store one line and exit 2 (never a traceback)."""

from __future__ import annotations

import time
from pathlib import Path

from ftrun.quarantine import Entry, QuarantineStore
from tests.conftest import Ftrun


def test_list_refuse_clear_and_a_broken_store(ftrun: Ftrun, tmp_path: Path) -> None:
    path = tmp_path / "state" / "quarantine.json"
    env = {"FTRUN_QUARANTINE_FILE": str(path)}
    out = ftrun.run("hosts", "--quarantined", env=env)
    assert out.returncode == 0 and "no host is quarantined" in out.stdout, out.stderr
    QuarantineStore(path).add(Entry(host="node2", until_t=time.time() + 3600,
                                    reason="3 failures within 600 s, the last: host node2 was lost",
                                    failures=3, job="train-1a2b3c", transport="ssh",
                                    since_t=time.time()))  # fmt: skip
    out = ftrun.run("hosts", "--quarantined", env=env)
    assert out.returncode == 0, out.stderr
    assert "node2" in out.stdout and "host node2 was lost (job train-1a2b3c)" in out.stdout
    # Refused before any job is looked for: the host is the problem, said with the way out.
    out = ftrun.run("hosts", "train", "add", "node2", env=env)
    assert out.returncode == 2 and "node2 is quarantined until" in out.stderr
    assert "ftrun hosts --quarantined --clear node2" in out.stderr
    assert "Traceback" not in out.stderr
    out = ftrun.run("hosts", "--quarantined", "--clear", "node2", env=env)
    assert out.returncode == 0 and "node2 is no longer quarantined" in out.stderr
    assert QuarantineStore(path).active() == []
    out = ftrun.run("hosts", "--quarantined", "--clear", "node2", env=env)
    assert out.returncode == 2 and "not quarantined: node2" in out.stderr
    path.write_text("[]")
    out = ftrun.run("hosts", "--quarantined", env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "is not one ftrun wrote" in out.stderr and "--clear all" in out.stderr
    out = ftrun.run("hosts", "--quarantined", "--clear", "all", env=env)
    assert out.returncode == 0 and QuarantineStore(path).active() == []
    out = ftrun.run("hosts", "train", "--quarantined", env=env)
    assert out.returncode == 2 and "of no one job" in out.stderr
