"""One configured job run in this process, from its LaunchConfig to its exit code: what
`ftrun launch` and `ftrun resume` share.

Around the Supervisor: the metrics server (bound first, so that a port in use stops us before a
job), the job's summary kept off the loop, the journal and controller.log, the console (every
rank, or those torchrun's --redirects and --local-ranks-filter leave on it), a warning for what
runs insecurely, the transport the config names, a Slurm requeue last, and the line that says
how the job ended and where to look.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path

from ftrun.cli.render import ConsoleReporter, make_console, print_root_cause
from ftrun.cli.torchrun_values import Echo, EchoingReporter
from ftrun.config import LaunchConfig, resolve_run_dir
from ftrun.controller.adoption import Adoption
from ftrun.controller.planning import PROFILE_FILE
from ftrun.controller.policy_file import FaultPolicy
from ftrun.controller.reporting import JobOutcome, OutcomeState
from ftrun.errors import FtrunError
from ftrun.jobview.keeper import keeping_summary
from ftrun.journal import Journal
from ftrun.journal.read import ResumePoint
from ftrun.transport.options import SlurmOptions, SshOptions
from ftrun.transport.registry import backend, make_transport, options_of

console = make_console(stderr=True)


def run(
    config: LaunchConfig,
    policy: FaultPolicy,
    resume: ResumePoint | None = None,
    adoption: Adoption | None = None,
    *,
    echo: Echo | None = None,
) -> int:
    """Run the job to its end; its exit code. `resume` and `adoption`: `ftrun resume`'s."""
    with contextlib.ExitStack() as stack:
        metrics = None
        if config.metrics_port is not None:  # bound first: a port in use stops us before a job
            from ftrun.cli.metrics import serving

            metrics = stack.enter_context(serving(config.metrics_addr, config.metrics_port))
        # The job's summary (status reads it) and the metrics' figures, kept off the loop.
        on_view = None if metrics is None else metrics.update
        stack.enter_context(keeping_summary(config.job_dir, on_view=on_view))
        port = None if metrics is None else metrics.port
        return _run(config, policy, resume, adoption, port, echo)


def _run(
    config: LaunchConfig,
    policy: FaultPolicy,
    resume: ResumePoint | None,
    adoption: Adoption | None,
    metrics_port: int | None,
    echo: Echo | None,
) -> int:
    from ftrun.controller.supervisor import Supervisor

    journal = Journal(config.job_dir, existing=config.job_dir.is_dir(), umask=config.umask)
    journal.write_config({**config.to_json(), "policy": dataclasses.asdict(policy)})
    if config.profile is not None and not (config.job_dir / PROFILE_FILE).exists():
        # The job's own copy: a requeued or resumed job plans from it, never re-profiles.
        journal.files.replace(PROFILE_FILE, Path(config.profile).read_bytes())
    log_file = open(journal.files.open_append("controller.log"), "a", encoding="utf-8")
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger("ftrun").addHandler(handler)
    logging.getLogger("ftrun").setLevel(logging.INFO)
    reporter = (
        ConsoleReporter(console)
        if echo is None
        else EchoingReporter(console, echo, config.nproc_per_node)
    )
    reporter.notice(f"job {config.job_id} (directory {config.job_dir})")
    if metrics_port is not None:
        journal.record("metrics_listening", addr=config.metrics_addr, port=metrics_port)
        reporter.notice(f"metrics for Prometheus: http://{config.metrics_addr}:{metrics_port}/")
    transport = backend(config.transport)
    if transport.remote and not config.control_tls:
        reporter.notice(
            "the control plane between hosts is NOT encrypted (--insecure-plain-control): "
            "the network sees what the ranks print",
            level="warning",
        )
    ssh = options_of(config, SshOptions)
    if transport.checks_host_keys and ssh is not None and not ssh.check_host_keys:
        reporter.notice(
            "ssh host keys are NOT checked (--insecure-skip-host-key-check): whoever answers "
            "on a host's address gets the job and its secret",
            level="warning",
        )
    try:
        supervisor = Supervisor(
            config,
            policy=policy,
            journal=journal,
            transport=make_transport(config),
            reporter=reporter,
            resume=resume,
            adoption=adoption,
        )
        outcome = asyncio.run(supervisor.run())
        if outcome.state is OutcomeState.REQUEUED:
            outcome = requeue_job(config, journal, outcome)
    finally:
        journal.close()
        logging.getLogger("ftrun").removeHandler(handler)
        handler.close()
        log_file.close()
    level = {"succeeded": "info", "stopped": "warning"}.get(outcome.state, "error")
    reporter.notice(f"job {config.job_id} {outcome.state}: {outcome.reason}", level=level)
    print_root_cause(console, outcome.root_cause)
    if outcome.state != "succeeded":
        run_dir_flag = (
            "" if config.run_dir == resolve_run_dir(None) else f" --run-dir {config.run_dir}"
        )
        reporter.notice(f"see `ftrun inspect {config.job_id}{run_dir_flag}`")
    return outcome.exit_code


def requeue_job(config: LaunchConfig, journal: Journal, outcome: JobOutcome) -> JobOutcome:
    """Put the Slurm job back in the queue, last: Slurm then ends this batch step, and the
    requeued one resumes this job directory."""
    from ftrun.slurmctl import requeue

    slurm = options_of(config, SlurmOptions)
    assert slurm is not None and slurm.slurm_job_id is not None
    try:
        requeue(slurm.slurm_job_id)
    except FtrunError as e:
        journal.record("requeue_failed", slurm_job_id=slurm.slurm_job_id, error=e.message)
        return dataclasses.replace(
            outcome, state=OutcomeState.PREEMPTED, reason=f"{outcome.reason}; {e.message}"
        )
    journal.record("requeued", slurm_job_id=slurm.slurm_job_id)
    return outcome
