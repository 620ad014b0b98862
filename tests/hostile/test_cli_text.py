"""Attacks on what `ftrun status` and `inspect` print (issue 11, finding 7): job names, hosts, log
lines and messages that are rich markup or terminal escapes, a damaged journal, a run dir that is
a file, a policy file of the wrong types. Each must be shown as written, or refused in one
message: never a MarkupError, a restyled listing, a cleared screen or a traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ftrun.cli.safetext import clean, make_console, plain
from tests.hostile.clidriver import ftrun_cli

ESC = "\x1b"
HOSTILE = [
    "[/]x",
    "[bold]",
    "[link=file:///etc/passwd]x[/link]",
    "[hang]",
    ":smile:",
    f"{ESC}[2Jcleared",
    f"{ESC}]8;;http://evil/{ESC}\\link",
    "a\u202eb",
]


def write_job(run_dir: Path, job_id: str, events: list[dict[str, Any]] | bytes) -> Path:
    job_dir = run_dir / job_id
    job_dir.mkdir(parents=True)
    body = (
        events
        if isinstance(events, bytes)
        else "".join(json.dumps(e) + "\n" for e in events).encode()
    )
    (job_dir / "events.jsonl").write_bytes(body)
    return job_dir


def hostile_job(run_dir: Path, job_id: str, text: str) -> None:
    t = time.time()
    write_job(
        run_dir,
        job_id,
        [
            {"t": t, "kind": "job_started", "name": text, "hosts": [text], "spares": []},
            {"t": t, "kind": "generation_launched", "gen": 1, "hosts": [text], "world_size": 1},
            {
                "t": t,
                "kind": "fault_detected",
                "incident": 1,
                "gen": 1,
                "host": text,
                "rank": 0,
                "exception": text,
                "traceback": f"Traceback:\n  {text}",
                "tail": [text],
                "stacks": {"0": text},
                "states": {"0": text},
            },
            {"t": t, "kind": "fault_classified", "incident": 1, "tier": text, "reason": text},
            {
                "t": t,
                "kind": "job_finished",
                "state": "failed",
                "reason": text,
                "root_cause": {"kind": "crash", "rank": 0, "host": text, "exception": text},
            },
        ],
    )


def shown(text: str) -> str:
    """What the listing must show for `text`: itself, control characters escaped."""
    return clean(text)


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_shown_as_written(tmp_path: Path, text: str):
    hostile_job(tmp_path, "job-1", text)
    hostile_job(tmp_path, "job-2", "plain")
    env = {"FTRUN_RUN_DIR": str(tmp_path)}
    listing = ftrun_cli(["status"], env)
    assert listing.code == 0, listing.output
    assert "job-1" in listing.stdout and "job-2" in listing.stdout  # one bad job spoils nothing
    for args in (["status"], ["status", "job-1"], ["inspect", "job-1"]):
        run = ftrun_cli(args, env)
        assert run.code == 0 and "internal error" not in run.stderr, run.output
        assert shown(text) in run.stdout, (args, run.stdout)
        assert ESC not in run.stdout and "\u202e" not in run.stdout  # piped: no styling either
    detail = ftrun_cli(["inspect", "job-1"], env).stdout
    assert detail.count(shown(text)) >= 6  # name, host, exception, reason, tier, stacks...


def test_status_of_a_job_id_that_is_markup(tmp_path: Path):
    run = ftrun_cli(["status", "[/]"], {"FTRUN_RUN_DIR": str(tmp_path)})
    assert run.code == 2 and "error: no job '[/]' in" in run.stderr, run.output


def test_console_escapes_control_characters_on_a_terminal():
    """With colour on (a terminal), ftrun's own styles are the only escapes written."""
    console = make_console()
    console.file = __import__("io").StringIO()
    console._force_terminal = True  # the rendering a terminal gets
    text = f"{ESC}[2J{ESC}]52;c;aGk={ESC}\\ [/] \x07\x00\x9b"
    console.print(plain(text, "bold"))
    console.print(text)
    out = console.file.getvalue()
    assert "\\x1b[2J" in out and "\\x1b]52" in out and "\\x07" in out and "\\x9b" in out
    assert f"{ESC}[2J" not in out and f"{ESC}]" not in out and "\x07" not in out
    assert "[/]" in out


def test_damaged_journal_is_marked_not_fatal(tmp_path: Path):
    t = time.time()
    good = {"t": t, "kind": "job_started", "name": "sound"}
    write_job(
        tmp_path,
        "bad-1",
        b"\n".join(
            [
                json.dumps(good).encode(),
                b'{"t": "x", "kind": "progress"}',
                b'{"kind": "generation_launched", "gen": []}',
                b"[1, 2]",
                b"\xff\xfe not utf-8",
                b'{"kind": "x", "nul": "\x00"}',
                b'{"t": NaN, "kind": "progress"}',
                b'{"t": 1e999, "kind": "progress"}',
                b'{"kind": "job_finished", "state": "succ',  # torn last line: not damage
            ]
        ),
    )
    write_job(tmp_path, "good-1", [good])
    env = {"FTRUN_RUN_DIR": str(tmp_path)}
    listing = ftrun_cli(["status"], env)
    assert listing.code == 0, listing.output
    rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert "(damaged)" in rows["bad-1"] and "(damaged)" not in rows["good-1"]
    for args in (["status", "bad-1"], ["inspect", "bad-1"]):
        run = ftrun_cli(args, env)
        assert run.code == 0, run.output
        assert "damaged: 7 bad lines in events.jsonl (line 2: `t` is not a time" in run.stdout
    data = json.loads(ftrun_cli(["status", "--json"], env).stdout)
    damage = {j["job_id"]: j["damaged"] for j in data}
    assert damage["good-1"] is None and damage["bad-1"].startswith("7 bad lines")


def test_an_oversized_line_is_skipped_without_reading_it_whole(tmp_path: Path, monkeypatch):
    import ftrun.journal.read as journal

    monkeypatch.setattr(journal, "MAX_EVENT_BYTES", 1024)
    event = {"t": 1.0, "kind": "job_started", "name": "after"}
    write_job(
        tmp_path,
        "big",
        b'{"kind": "x", "pad": "' + b"a" * 5000 + b'"}\n' + json.dumps(event).encode() + b"\n",
    )
    read = journal.read_journal(tmp_path / "big")
    assert read.events == [event] and read.bad_lines == 1 and "longer than" in read.problems[0]


def test_a_torn_last_line_is_not_damage(tmp_path: Path):
    from ftrun.journal.read import read_journal

    write_job(tmp_path, "torn", b'{"t": 1, "kind": "job_started"}\n{"t": 2, "kind": "pro\xe2\x82')
    read = read_journal(tmp_path / "torn")
    assert len(read.events) == 1 and read.bad_lines == 0 and read.damage is None


@pytest.mark.parametrize("command", [["status"], ["status", "x"], ["inspect", "x"]])
@pytest.mark.parametrize("inside", [False, True])
def test_run_dir_that_is_a_file(tmp_path: Path, command: list[str], inside: bool):
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    run_dir = afile / "runs" if inside else afile
    for env, args in (
        ({"FTRUN_RUN_DIR": str(run_dir)}, command),
        ({}, [*command, "--run-dir", str(run_dir)]),
    ):
        run = ftrun_cli(args, env)
        assert run.code == 2 and "internal error" not in run.stderr, run.output
        assert f"error: the run directory {run_dir} " in run.stderr
        assert "a file, not a directory" in run.stderr and "File exists" not in run.stderr
        assert "hint: pass a directory to --run-dir or FTRUN_RUN_DIR" in run.stderr


def test_launch_into_a_run_dir_that_is_a_file(tmp_path: Path):
    script = tmp_path / "s.py"
    script.write_text("print('never runs')\n")
    afile = tmp_path / "afile"
    afile.write_text("")
    for args in (["launch", str(script)], ["launch", "--job-id", "j-1", str(script)]):
        run = ftrun_cli(args, {"FTRUN_RUN_DIR": str(afile)})
        assert run.code == 2, run.output
        assert run.stderr.count("is a file, not a directory") == 1, run.stderr
        assert "never runs" not in run.output and afile.read_text() == ""


@pytest.mark.parametrize(
    "policy, needle",
    [
        ("hang = 5\n", "[hang]: expected a table like [hang] floor_s = 2, got the integer 5"),
        ("[[rules]]\ntier = 'fatal'\nkinds = ['host']\n", "rules[0].kinds must be among"),
        ("[[rules]]\ntier = 'fatal'\nname = 5\n", "rules[0].name: expected a string"),
        ("[timeouts]\nhost_lost_timeout_s = 'x'\n", "[timeouts].host_lost_timeout_s: expected"),
    ],
)
def test_launch_with_a_bad_policy_gets_the_policy_hint(tmp_path: Path, policy: str, needle: str):
    script = tmp_path / "s.py"
    script.write_text("print('never runs')\n")
    (tmp_path / "p.toml").write_text(policy)
    run = ftrun_cli(
        ["launch", "--policy", str(tmp_path / "p.toml"), str(script)],
        {"FTRUN_RUN_DIR": str(tmp_path / "runs")},
    )
    assert run.code == 2 and needle in run.stderr, run.output
    assert "hint: see docs/policy.md for the policy file format" in run.stderr
    assert not (tmp_path / "runs").exists()


def test_an_unreadable_journal_is_one_damaged_job(tmp_path: Path, monkeypatch):
    """A journal that cannot be opened (as root, permissions cannot make one: a patched open)."""
    import builtins

    t = time.time()
    write_job(tmp_path, "locked", [{"t": t, "kind": "job_started", "name": "locked"}])
    write_job(tmp_path, "open", [{"t": t, "kind": "job_started", "name": "open"}])
    real_open = builtins.open

    def deny(file, *args, **kwargs):
        if str(file).endswith("locked/events.jsonl"):
            raise PermissionError(13, "Permission denied")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", deny)
    run = ftrun_cli(["status"], {"FTRUN_RUN_DIR": str(tmp_path)})
    assert run.code == 0, run.output
    rows = {line.split()[0]: line for line in run.stdout.splitlines()[1:]}
    assert "(damaged)" in rows["locked"] and "(damaged)" not in rows["open"]
    detail = ftrun_cli(["status", "locked"], {"FTRUN_RUN_DIR": str(tmp_path)})
    assert (
        "damaged: cannot read the journal of" in detail.stdout
        and "Permission denied" in detail.stdout
    )


def test_a_job_directory_named_with_markup_and_escapes(tmp_path: Path):
    name = "[bold]\x1b[2J[red"  # no "/": a directory name
    hostile_job(tmp_path, name, "x")
    for args in (["status"], ["status", "[bold]"], ["inspect", name]):
        run = ftrun_cli(args, {"FTRUN_RUN_DIR": str(tmp_path)})
        assert run.code == 0 and "internal error" not in run.stderr, (args, run.output)
        assert clean(name) in run.stdout and "\x1b" not in run.output


def test_a_torn_line_a_resumed_controller_closed_is_not_damage(tmp_path: Path):
    from ftrun.journal import Journal
    from ftrun.journal.read import read_journal

    write_job(tmp_path, "resumed", b'{"t": 1, "kind": "job_started"}\n{"t": 2, "kind": "pro')
    journal = Journal(tmp_path / "resumed", existing=True)  # a requeued job: it closes the line
    journal.record("job_started")
    journal.record("job_finished", state="succeeded")
    journal.close()
    read = read_journal(tmp_path / "resumed")
    assert [e["kind"] for e in read.events] == ["job_started", "job_started", "job_finished"]
    assert read.damage is None
    # The same torn line anywhere else is damage.
    write_job(
        tmp_path, "torn", b'{"t": 1, "kind": "job_started"}\n{"t": 2, "ki\n{"t": 3, "kind": "x"}\n'
    )
    assert read_journal(tmp_path / "torn").bad_lines == 1
