"""Where the agent finds py-spy: beside its interpreter (a venv not activated), else on PATH."""

from __future__ import annotations

import sys
from pathlib import Path

from ftrun.agent import stacks


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_py_spy_beside_the_interpreter_wins_over_path(tmp_path: Path, monkeypatch):
    venv_spy = executable(tmp_path / "venv" / "bin" / "py-spy")
    executable(tmp_path / "elsewhere" / "py-spy")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert stacks.py_spy() == str(venv_spy)


def test_py_spy_on_path_when_none_beside_the_interpreter(tmp_path: Path, monkeypatch):
    on_path = executable(tmp_path / "elsewhere" / "py-spy")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "py-spy").write_text("not executable")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert stacks.py_spy() == str(on_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert stacks.py_spy() is None
