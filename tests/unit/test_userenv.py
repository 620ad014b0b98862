"""--env and --env-file as users write them, and every way they get them wrong."""

from __future__ import annotations

from pathlib import Path

from ftrun.userenv import user_env

HERE = {"HF_TOKEN": "from-launcher", "HOME": "/root"}


def test_file_then_flags_later_wins(tmp_path: Path):
    env_file = tmp_path / "job.env"
    env_file.write_text(
        "# secrets for the job\n"
        "\n"
        "DATA_DIR=/mnt/data\n"
        "  export WANDB_PROJECT = llm  \n"
        'WANDB_API_KEY="k=1 2"\n'
        "QUOTE='it''s'\n"
        "EMPTY=\n"
        "HF_TOKEN\n"
        "OVERRIDDEN=file\n"
    )
    pairs, problems = user_env([env_file], ["OVERRIDDEN=flag", "HOME", "X=a=b"], HERE)
    assert problems == []
    assert dict(pairs) == {
        "DATA_DIR": "/mnt/data",
        "WANDB_PROJECT": "llm",
        "WANDB_API_KEY": "k=1 2",
        "QUOTE": "it''s",
        "EMPTY": "",
        "HF_TOKEN": "from-launcher",
        "OVERRIDDEN": "flag",
        "HOME": "/root",
        "X": "a=b",
    }


def test_every_problem_at_once_and_never_a_value(tmp_path: Path):
    env_file = tmp_path / "bad.env"
    env_file.write_text("GOOD=1\nthis is not a pair\n2FAST=secret-value-1\nRANK=3\nNOT_HERE\n")
    pairs, problems = user_env(
        [env_file, tmp_path / "missing.env"],
        ["TORCHELASTIC_RUN_ID=x", "bad name=secret-value-2", "ALSO_NOT_HERE", "FTRUN_JOB_ID=y"],
        HERE,
    )
    text = "\n".join(problems)
    assert len(problems) == 9, text
    assert f"--env-file {env_file}, line 2: not NAME=VALUE" in text
    assert f"--env-file {env_file}, line 3: not NAME=VALUE" in text
    assert "line 4: RANK is set for each rank by torchrun or ftrun" in text
    assert "line 5: NOT_HERE is not set here" in text
    assert f"--env-file '{tmp_path / 'missing.env'}' cannot be read" in text
    assert "--env TORCHELASTIC_RUN_ID: TORCHELASTIC_RUN_ID is set for each rank" in text
    assert "--env FTRUN_JOB_ID: FTRUN_JOB_ID is set for each rank" in text
    assert "--env ALSO_NOT_HERE: ALSO_NOT_HERE is not set here" in text
    assert "secret-value" not in text
    assert dict(pairs) == {"GOOD": "1"}


def test_a_nul_byte_in_a_value_is_refused_by_line_not_carried_to_the_agent(tmp_path: Path):
    """It killed the agent with a traceback (issue 34): no environment can hold it."""
    path = tmp_path / "env"
    path.write_bytes(b"A=1\nSECRET=ab\x00cd\n")
    values, problems = user_env([path], [], {})
    assert dict(values) == {"A": "1"}
    assert problems == [
        f"--env-file {path}, line 2: the value of SECRET holds a NUL byte, which no environment can"
    ]
    assert "ab" not in problems[0]


def test_a_name_with_a_trailing_line_break_is_not_a_name():
    """`$` matches before a final newline; the whole name must match (issue 34)."""
    pairs, problems = user_env([], ["NAME\n=1", "OK=1"], HERE)
    assert dict(pairs) == {"OK": "1"}
    assert len(problems) == 1 and "not NAME=VALUE" in problems[0]
