"""The transports by name (ftrun/transport/registry.py) and the one escalation ladder
(ftrun/transport/escalate.py): capabilities asked, not names compared; each step its share."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest

from ftrun.cli import saved_launch
from ftrun.cli.resume import config_from_saved
from ftrun.config import LaunchConfig
from ftrun.errors import UsageError
from ftrun.transport.escalate import escalate
from ftrun.transport.options import LocalOptions, SlurmOptions, SshOptions
from ftrun.transport.registry import BACKENDS, backend, make_transport, options_from, options_of


def test_every_transport_says_what_it_can_do():
    assert set(BACKENDS) == {"local", "ssh", "slurm"}
    local, ssh, slurm = backend("local"), backend("ssh"), backend("slurm")
    assert (local.remote, ssh.remote, slurm.remote) == (False, True, True)
    assert [b.name for b in BACKENDS.values() if b.checks_host_keys] == ["ssh"]
    # srun ends the agents with the batch step: no grace to wait out for an adopter
    assert [b.name for b in BACKENDS.values() if not b.agents_wait_for_controller] == ["slurm"]
    assert local.resume_problem("job-1") is None and ssh.resume_problem("job-1") is None


def test_an_unknown_transport_is_one_message():
    with pytest.raises(UsageError, match="no transport 'mpi' \\(one of local, ssh, slurm\\)"):
        backend("mpi")


FLAGS = {"ssh_config": "/etc/ssh/cfg", "check_host_keys": False, "slurm_job_id": "41",
         "slurm_restart_count": 2, "gpus_per_node": 8}  # fmt: skip


def test_each_transport_keeps_its_own_options_of_all_the_flags_given():
    assert options_from("ssh", FLAGS) == SshOptions(
        ssh_config="/etc/ssh/cfg", check_host_keys=False
    )
    assert options_from("slurm", FLAGS) == SlurmOptions(
        slurm_job_id="41", slurm_restart_count=2, gpus_per_node=8
    )
    assert options_from("local", FLAGS) == LocalOptions()
    config = LaunchConfig(job_id="j-1", job_name="j", run_dir=Path("/r"), script="t.py",
                          transport="slurm", transport_options=options_from("slurm", FLAGS))  # fmt: skip
    assert options_of(config, SlurmOptions) == SlurmOptions(slurm_job_id="41",
                                                            slurm_restart_count=2, gpus_per_node=8)  # fmt: skip
    assert options_of(config, SshOptions) is None  # asked by capability, not by name
    # No options given: the transport's defaults.
    plain = dataclasses.replace(config, transport="ssh", transport_options=None)
    assert options_of(plain, SshOptions) == SshOptions()
    wrong = dataclasses.replace(config, transport="ssh")
    with pytest.raises(UsageError, match="the ssh transport takes SshOptions, not SlurmOptions"):
        make_transport(wrong)


def test_config_json_nests_them_and_a_flat_one_of_before_still_resumes(tmp_path: Path):
    config = LaunchConfig(job_id="j-1", job_name="j", run_dir=tmp_path, script="t.py",
                          transport="ssh", hosts=("a", "b"),
                          transport_options=options_from("ssh", FLAGS))  # fmt: skip
    saved = json.loads(json.dumps(config.to_json()))
    assert saved["transport_options"] == {"ssh_config": "/etc/ssh/cfg", "check_host_keys": False}
    assert saved_launch.problems(saved) == []
    again = config_from_saved(saved, tmp_path / "j-1", {})
    assert again.transport_options == config.transport_options
    old = {k: v for k, v in saved.items() if k != "transport_options"}
    old.update(ssh_config="/etc/ssh/old", check_host_keys=True)  # as an ftrun of before wrote it
    resumed = config_from_saved(old, tmp_path / "j-1", {})
    assert resumed.transport_options == SshOptions(ssh_config="/etc/ssh/old")
    bad = {**saved, "transport_options": {"check_host_keys": "no", "ssh_config": 3}}
    assert saved_launch.problems(bad) == [
        "transport_options.check_host_keys must be true or false (got 'no')",
        "transport_options.ssh_config must be a string or null (got 3)",
    ]
    assert saved_launch.problems({**saved, "transport_options": [1]}) == [
        "transport_options must be a table (got [1])"
    ]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_the_first_nudge_that_ends_it_is_the_last_tried():
    tried: list[str] = []

    async def go() -> bool:
        done = asyncio.Event()

        def close_stdin() -> None:
            tried.append("close")
            done.set()

        def sigterm() -> None:
            tried.append("term")

        return await escalate(done.wait, [None, close_stdin, sigterm], 3.0)

    assert run(go()) is True
    assert tried == ["close"]


def test_each_step_has_its_share_and_the_whole_stays_within_the_timeout():
    tried: list[float] = []

    async def go() -> bool:
        never = asyncio.Event()
        t0 = time.monotonic()

        async def slow_nudge() -> None:  # a nudge that cannot be delivered (a stuck channel)
            tried.append(time.monotonic() - t0)
            await asyncio.sleep(5)

        return await escalate(never.wait, [None, slow_nudge], 0.4)

    t0 = time.monotonic()
    assert run(go()) is False
    elapsed = time.monotonic() - t0
    assert len(tried) == 1 and tried[0] >= 0.15  # only after the first share (0.2 s)
    assert elapsed < 3  # the stuck nudge is given its share (0.2 s), not its 5 s
