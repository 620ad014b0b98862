"""Reading torch's error files (what `@record` writes) as the agent does, written by torch's own
ErrorHandler where it can be, and malformed in the ways a dying process leaves them."""

from __future__ import annotations

import json

import pytest
from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

from ftrun.agent import error_file


def test_reads_what_torch_writes(tmp_path, monkeypatch):
    path = tmp_path / "run_x" / "attempt_0" / "1" / "error.json"
    path.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise ValueError("bad shape\nsecond line")
    except ValueError as e:
        ErrorHandler().record_exception(e)
    assert error_file.find(tmp_path, 1) == path and error_file.find(tmp_path, 0) is None
    got = error_file.read(path)
    assert got["exception"] == "ValueError: bad shape"
    assert got["message"] == "ValueError: bad shape\nsecond line"
    assert (
        got["traceback"].startswith("Traceback")
        and "test_reads_what_torch_writes" in got["traceback"]
    )


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"message": "RuntimeError: plain"}', "RuntimeError: plain"),  # the bare-string shape
        ('{"message": {"message": "OSError: x", "extraInfo": 3}}', "OSError: x"),
        ('{"message": {"message": "", "extraInfo": {}}}', None),
        ('{"message": {"extraInfo": {}}}', "not an error file"),
        ('{"message": 5}', "not an error file"),
        ("[1, 2]", "not an error file"),
        ('{"message": {"mess', "not an error file"),  # cut short by a kill
        ("", "not an error file"),
    ],
)
def test_malformed_files_are_not_errors(tmp_path, content, expected):
    path = tmp_path / "error.json"
    path.write_text(content)
    got = error_file.read(path)
    if expected == "not an error file":
        assert got is None
    else:
        assert got is not None and got["exception"] == expected and got["traceback"] is None


def test_oversized_or_missing_files_are_skipped(tmp_path):
    big = tmp_path / "error.json"
    big.write_text(json.dumps({"message": "x" * (error_file.MAX_BYTES + 10)}))
    assert error_file.read(big) is None
    assert error_file.read(tmp_path / "absent.json") is None
