"""The batch script `ftrun sbatch` writes: golden files pin every line (as submitit pins its
sbatch string), bash reads the step's arguments back exactly, and the option parsers and the
shared launch options are table-tested.

Regenerate the golden files after an intended change, then read the diff:
    FTRUN_UPDATE_GOLDEN=1 pytest tests/unit/test_batch_script.py
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
from itertools import zip_longest
from pathlib import Path

import pytest

from ftrun.cli import launch, launch_options, sbatch
from ftrun.cli.batch_script import BatchScript, PreemptSignal, parse_signal, parse_time

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
# Stable stand-ins for what the command reads from the machine.
STABLE = dict(job_id="train-0a1b2c", cwd="/home/ada/proj", python="/home/ada/venv/bin/python")

CASES: dict[str, BatchScript] = {
    "sbatch_basic.sh": BatchScript(
        **STABLE,
        job_name="train",
        run_dir=Path("/home/ada/.ftrun/runs"),
        script="train.py",
        script_args=("--lr", "3e-4"),
        nodes=4,
        time="4:00:00",
        launch_args=("--nproc-per-node", "8"),
    ),
    "sbatch_spares_gpus_norequeue.sh": BatchScript(
        **STABLE,
        job_name="llama",
        run_dir=Path("/scratch/runs"),
        script="train.py",
        nodes=16,
        spares=2,
        time="2-00:00:00",
        partition="gpu",
        gpus_per_node=8,
        signal=PreemptSignal("SIGUSR1", 300),
        requeue=False,
        sbatch_args=("--qos=high", "--exclusive", "-A research"),
        launch_args=(
            "--nproc-per-node",
            "8",
            "--max-restarts",
            "10",
            "--progress-regex",
            r"step (\d+)",
            "--cold-start",
        ),
    ),
    "sbatch_odd_paths.sh": BatchScript(
        job_id="my-run-0a1b2c",
        job_name="my run #2 'final'",
        run_dir=Path("/data/ada's runs/with space"),
        cwd="/home/ada/my proj",
        python="/opt/py env/bin/python",
        script='scripts/it\'s a "train".py',
        script_args=("--name", "a b", "--glob", "*.pt", "--money", "$HOME", "--empty", ""),
        nodes=2,
        sbatch_args=('--comment="two words"',),
        launch_args=("--env", "GREETING=hi there", "--env-file", "my env/.env"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_script_matches_its_golden_file(name: str) -> None:
    text = CASES[name].render()
    golden = GOLDEN / name
    if os.environ.get("FTRUN_UPDATE_GOLDEN") == "1" or not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    recorded = golden.read_text()
    changes = [
        f"line {k + 1}: {old!r} -> {new!r}"
        for k, (old, new) in enumerate(zip_longest(recorded.splitlines(), text.splitlines()))
        if old != new
    ]
    assert not changes, (
        f"{golden} differs from the rendered script:\n"
        + "\n".join(changes)
        + "\nIf the change is intended: FTRUN_UPDATE_GOLDEN=1 pytest "
        "tests/unit/test_batch_script.py, and read the diff"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_bash_reads_the_step_back_exactly(name: str, tmp_path: Path) -> None:
    """The quoting holds: bash runs the script and the `exec`'d program gets exactly the
    arguments launch_command() meant, odd characters and all."""
    argv_printer = tmp_path / "print argv"
    argv_printer.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\"\n")
    argv_printer.chmod(0o755)
    batch = CASES[name]
    probe = BatchScript(**{**batch.__dict__, "python": str(argv_printer)})
    script = tmp_path / "sbatch.sh"
    script.write_text(probe.render())
    out = subprocess.run(
        ["bash", str(script)], capture_output=True, check=True, timeout=30, cwd=tmp_path
    )
    assert out.stdout.decode().split("\0")[:-1] == probe.launch_command()[1:]


def test_the_script_holds_what_the_issue_asks_for() -> None:
    text = CASES["sbatch_spares_gpus_norequeue.sh"].render()
    for line in (
        "#SBATCH --nodes=18",  # 16 + 2 spares
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --no-kill",
        "#SBATCH --no-requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=/scratch/runs/train-0a1b2c/slurm-%j.out",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --chdir=/home/ada/proj",
        "#SBATCH -A research",
    ):
        assert line in text.splitlines()
    # Every #SBATCH line comes before the first command: sbatch reads no further.
    lines = text.splitlines()
    first_command = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert all(not ln.startswith("#SBATCH") for ln in lines[first_command:])
    assert lines[first_command].startswith("exec ")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("USR2@90", PreemptSignal("SIGUSR2", 90)),
        ("SIGUSR2@90", PreemptSignal("SIGUSR2", 90)),
        ("usr1@30", PreemptSignal("SIGUSR1", 30)),
        ("B:USR2@120", PreemptSignal("SIGUSR2", 120)),
        ("b:sigusr1@5", PreemptSignal("SIGUSR1", 5)),
    ],
)
def test_signal_accepted(text: str, expected: PreemptSignal) -> None:
    problems: list[str] = []
    assert parse_signal(text, problems) == expected
    assert problems == []


@pytest.mark.parametrize(
    "text, needle",
    [
        ("USR2", "[B:]NAME@SECONDS"),
        ("USR2@", "[B:]NAME@SECONDS"),
        ("@90", "[B:]NAME@SECONDS"),
        ("USR2@-1", "[B:]NAME@SECONDS"),
        ("USR2@ninety", "[B:]NAME@SECONDS"),
        ("R:USR2@90", "no such signal"),
        ("NOPE@90", "no such signal"),
        ("KILL@90", "ftrun keeps it"),
        ("TERM@90", "ftrun keeps it"),
        ("USR2@0", "1..65535"),
        ("USR2@70000", "1..65535"),
    ],
)
def test_signal_rejected(text: str, needle: str) -> None:
    problems: list[str] = []
    parse_signal(text, problems)
    assert len(problems) == 1 and needle in problems[0], problems


@pytest.mark.parametrize(
    "seconds, grace", [(90, 75), (300, 285), (30, 15), (20, 10), (3, 2), (1, 1)]
)
def test_ranks_get_the_notice_less_the_controllers_margin(seconds: int, grace: int) -> None:
    assert PreemptSignal("SIGUSR2", seconds).grace_s == grace


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 30 * 60),
        ("30:15", 30 * 60 + 15),
        ("4:00:00", 4 * 3600),
        ("1-12", 36 * 3600),
        ("1-12:30", 36 * 3600 + 30 * 60),
        ("2-00:00:01", 48 * 3600 + 1),
        ("0", 0),
    ],
)
def test_slurm_time_formats(text: str, seconds: int) -> None:
    problems: list[str] = []
    assert parse_time(text, problems) == seconds and problems == []


@pytest.mark.parametrize("text", ["", "4h", "1:2:3:4", "-5", "1-", "1-2:3:4:5", "1.5", "a:b"])
def test_slurm_time_rejected(text: str) -> None:
    problems: list[str] = []
    assert parse_time(text, problems) is None
    assert len(problems) == 1 and "MM:SS" in problems[0]


def test_launch_options_at_their_defaults_pass_nothing_on() -> None:
    defaults = {name: o.default for name, o in launch_options.PASSED_ON.items()}
    assert launch_options.argv(defaults) == []
    assert launch_options.argv({}) == []


def test_launch_options_pass_on_as_flags() -> None:
    argv = launch_options.argv(
        {
            "nproc_per_node": 8,
            "module": True,
            "warm_start": False,
            "env": ["A=1", "B"],
            "env_file": [Path("x.env")],
            "exit_timeout": 30.0,
            "hang_floor": 2.5,
            "forward_signal": ["USR1,USR2"],
        }
    )
    assert argv == [
        "--nproc-per-node", "8",
        "-m",
        "--forward-signal", "USR1,USR2",
        "--env", "A=1", "--env", "B",
        "--env-file", "x.env",
        "--exit-timeout", "30",
        "--cold-start",
        "--hang-floor", "2.5",
    ]  # fmt: skip


def test_sbatch_takes_the_launch_options_from_the_shared_table() -> None:
    """One definition per option: `ftrun sbatch` uses the very Option objects it passes on,
    so a flag's name, default and help cannot drift between the two commands."""
    for command in (sbatch.sbatch, launch.launch):
        parameters = inspect.signature(command).parameters
        for name, option in launch_options.PASSED_ON.items():
            assert parameters[name].default is option, (command.__name__, name)


def test_docs_show_the_basic_script_as_it_is_rendered() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "slurm.md").read_text()
    section = doc.split("## The generated script", 1)[1]
    shown = section.split("```bash\n", 1)[1].split("```", 1)[0]
    assert shown == (GOLDEN / "sbatch_basic.sh").read_text()


# Every value the script quotes, each made hostile in turn: a line break would end its #SBATCH
# line or the step's command, and the rest would run as a command (issue 34). NUL cannot come
# through argv, but can through a file (an env file, a resumed config): it is refused the same.
HOSTILE_FIELDS = {
    "--job-name": {"job_name": "x\ntouch /tmp/pwned"},
    "--partition": {"partition": "gpu\rtouch /tmp/pwned"},
    "--time": {"time": "1:00:00\ntouch /tmp/pwned"},
    "--sbatch-arg": {"sbatch_args": ("--qos=high\ntouch /tmp/pwned",)},
    "the current directory's path": {"cwd": "/home/ada/p\nroj"},
    "the run directory's path": {"run_dir": Path("/runs\x00/x")},
    "the Python interpreter's path": {"python": "/venv/bin/python\n"},
    "SCRIPT": {"script": "train.py\nrm -rf ~"},
    "the script's arguments": {"script_args": ("--lr", "3e-4\x00")},
    "the launch options": {"launch_args": ("--env", "A=1\nB=2")},
}


@pytest.mark.parametrize("named", sorted(HOSTILE_FIELDS))
def test_a_hostile_value_is_named_and_never_rendered(named: str) -> None:
    batch = dataclasses.replace(CASES["sbatch_basic.sh"], **HOSTILE_FIELDS[named])
    assert batch.line_breakers() == [named]
    with pytest.raises(ValueError, match="control characters"):
        batch.render()
    assert CASES["sbatch_basic.sh"].line_breakers() == []  # the golden cases are all clean
