"""The job and the user's quarantine store (ftrun/quarantine.py): hosts another job quarantined
are left out of this one until their expiry, said once at the start; each quarantine this job
decides is kept there for the jobs after it. The store is never a reason to fail a job: one that
cannot be read or written is a warning. A job on this machine alone (the local transport) neither
reads nor writes it: its one host cannot be left out of the next job."""

from __future__ import annotations

import time

from ftrun.config import LaunchConfig
from ftrun.controller.job import JobMachine
from ftrun.controller.reporting import Reporter
from ftrun.quarantine import Entry, QuarantineStore, StoreError
from ftrun.transport.registry import backend


class QuarantineDesk:
    def __init__(self, config: LaunchConfig, *, store: QuarantineStore, reporter: Reporter) -> None:
        self.config, self.store, self.reporter = config, store, reporter
        self.used = backend(config.transport).remote

    def bench_known(self, job: JobMachine) -> list[str]:
        """Leave out of `job` its hosts the store holds; those hosts."""
        if not self.used:
            return []
        known, problem = self.store.load()
        if problem is not None:
            self.reporter.notice(problem, level="warning")
        benched = []
        for host in (*self.config.hosts, *self.config.spares):
            entry = known.get(host)
            if entry is None or host in benched:
                continue
            job.bench(host, entry.until_t, entry.reason)
            benched.append(host)
            until = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.until_t))
            self.reporter.notice(
                f"{host} is quarantined until {until} ({entry.reason}, in job {entry.job}): "
                f"left out; `ftrun hosts --quarantined --clear {host}` to use it again",
                level="warning",
            )
        return benched

    def keep(self, host: str, until_t: float, why: str, failures: int) -> None:
        """A quarantine this job decided, kept for the jobs after it."""
        if not self.used:
            return
        q = self.config
        entry = Entry(host=host, until_t=until_t, reason=why,
                      failures=failures, job=q.job_id, transport=q.transport,
                      since_t=time.time())  # fmt: skip
        try:
            self.store.add(entry)
        except StoreError as e:
            self.reporter.notice(f"{host} quarantined for this job only: {e.message}",
                                 level="warning")  # fmt: skip
