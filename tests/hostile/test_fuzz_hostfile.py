"""Fuzzing the host lists users write: `--hosts`/`--spares` text and `--hostfile` files (bytes),
through `ftrun.hostlist` and through launch's own layer (`launch_hosts.host_options`). Nothing
may raise but a UsageError, and launch's layer raises nothing: it collects problems."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ftrun.cli.launch_hosts import host_options
from ftrun.errors import UsageError
from ftrun.hostlist import parse_host_list, read_hostfile

FUZZ = settings(max_examples=150, deadline=None)
# Text near the grammar (hosts, users, ports, slots=, comments) finds more than noise alone.
PIECES = st.sampled_from(
    [
        "a",
        "host-1",
        "user@",
        "@",
        ":",
        ":22",
        ":0",
        ":99999",
        "[",
        "]",
        "::1",
        " slots=",
        "slots=",
        "8",
        "0",
        "²",
        "٣",
        "#",
        ",",
        "\n",
        " ",
        "\t",
        "\x00",
        "é",
        "\u202e",
        "=",
    ]
)
NEAR = st.lists(PIECES, max_size=20).map("".join)
TEXT = st.one_of(NEAR, st.text(max_size=200))


def accepted(entries: list) -> None:
    for e in entries:
        assert e.target and e.target == e.target.strip()
        assert e.slots is None or e.slots >= 1


@FUZZ
@given(TEXT)
def test_host_list_text(text: str):
    try:
        accepted(parse_host_list(text))
    except UsageError as e:
        assert e.message and e.hint


@FUZZ
@given(st.one_of(TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=300)))
def test_hostfile_bytes(data: bytes):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hostfile"
        path.write_bytes(data)
        try:
            accepted(read_hostfile(path))
        except UsageError as e:
            assert e.message and e.hint
        problems: list[str] = []
        host_options(None, path, None, None, problems)
        assert all(isinstance(p, str) and p for p in problems)


@FUZZ
@given(st.one_of(st.none(), TEXT), st.one_of(st.none(), TEXT))
def test_host_options_collects_problems(hosts: str | None, spares: str | None):
    problems: list[str] = []
    host_options(hosts, None, spares, None, problems)
    assert all(isinstance(p, str) and p for p in problems)
