"""`ftrun launch --metrics-port PORT`: the job's figures for Prometheus, where cluster users
already look.

Rendered in prometheus-client's exposition format from the job's view that the launcher's
summary thread keeps current (jobview/keeper.py: the journal folded as it grows, the fold
`status` and `inspect` read too, so the three never disagree): state, generation, step and step
rate, hosts by state, restarts, incidents by kind and tier, the last detection and recovery
times, and goodput with its badput buckets (a job without a progress signal has no goodput
sample: `ftrun_goodput_known` is 0 instead). The page is rendered once a second, off the
controller's event loop, and served by a bounded server (metrics_server.py: a cap on
connections, a deadline on each) that answers every scrape with those bytes: a scrape never
reads the journal. Bound to 127.0.0.1 unless --metrics-addr says otherwise: the figures name
hosts and failures.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ftrun.cli.metrics_server import BoundedServer
from ftrun.cli.watch import step_rate
from ftrun.errors import UsageError
from ftrun.jobview import STATES, JobView
from ftrun.jobview.goodput import BUCKETS, job_goodput

SHUTDOWN_TIMEOUT_S = 5.0


class JobCollector(Collector):
    """The job's figures from its latest view (none before the journal has events)."""

    def __init__(self, view: JobView | None = None) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        view = self.view
        if view is None or not view.events_read:
            return
        now = time.time()

        def gauge(name: str, doc: str, value: float | None) -> Metric:
            g = GaugeMetricFamily(f"ftrun_{name}", doc)
            if value is not None:
                g.add_metric([], value)
            return g

        states = GaugeMetricFamily("ftrun_job_state", "1 for the job's state", labels=["state"])
        for state in STATES:
            states.add_metric([state], 1.0 if view.state == state else 0.0)
        yield states
        yield gauge("generation", "The running (or last) generation", view.generation)
        yield gauge("step", "The job's step", view.step)
        yield gauge("steps_per_second", "Step rate over the last seconds", step_rate(view, now))
        restarts = CounterMetricFamily("ftrun_restarts", "Restarts after faults")
        restarts.add_metric([], view.restarts)
        yield restarts
        incidents = CounterMetricFamily(
            "ftrun_incidents", "Incidents by kind and tier", labels=["kind", "tier"]
        )
        for (kind, tier), n in Counter((i.kind, i.tier or "") for i in view.incidents).items():
            incidents.add_metric([kind, tier], n)
        yield incidents
        hosts = GaugeMetricFamily("ftrun_hosts", "Hosts by state", labels=["state"])
        for state, n in Counter(view.hosts.values()).items():
            hosts.add_metric([state], n)
        yield hosts
        last = view.incidents[-1] if view.incidents else None
        yield gauge(
            "last_detection_seconds",
            "Fault to detection, last incident",
            last.detected_s if last else None,
        )
        yield gauge(
            "last_recovery_seconds", "Fault to first step again, last incident",
            last.recovered_s if last else None,
        )  # fmt: skip
        report = job_goodput(view, now=now).job
        # Unknown (no progress signal, or no wall time yet): no sample, the Prometheus way of
        # saying it (not 0, not NaN); goodput_known says which, for alerts and dashboards.
        yield gauge("goodput_ratio", "Kept training time / wall time", report.ratio)
        yield gauge(
            "goodput_known",
            "1 when goodput_ratio has a value; 0 when it is unknown (no progress signal: the "
            "script reports no steps, see ftrun.step / --progress-regex)",
            0.0 if report.ratio is None else 1.0,
        )
        yield gauge(
            "unknown_seconds",
            "Wall time the ranks ran without reporting a step (start-up or training: unknown)",
            report.unknown_s,
        )
        yield gauge("wall_seconds", "The job's wall time so far", report.wall_s)
        badput = GaugeMetricFamily(
            "ftrun_badput_seconds", "Wall time lost, by bucket", labels=["bucket"]
        )
        for bucket in BUCKETS:
            badput.add_metric([bucket], report.buckets[bucket])
        yield badput
        pace = GaugeMetricFamily(
            "ftrun_compute_seconds_per_step",
            "Each host's (a one-host job: rank's) compute time per step, waits in collectives "
            "left out: the latest round (docs/policy.md, Stragglers)",
            labels=["unit"],
        )
        for unit, value in sorted(view.pace.latest.items()):
            pace.add_metric([unit], value)
        yield pace
        stragglers = GaugeMetricFamily(
            "ftrun_stragglers", "Hosts named stragglers and not recovered", labels=["unit"]
        )
        for s in view.pace.stragglers:
            if s.get("recovered_t") is None:
                stragglers.add_metric([str(s.get("unit"))], 1.0)
        yield stragglers


class Metrics:
    """The server and what it serves: `update` renders a view into the page every scrape gets."""

    def __init__(self, server: BoundedServer) -> None:
        self.server = server
        self.port = server.port
        self.collector = JobCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

    def update(self, view: JobView) -> None:
        self.collector.view = view
        self.server.update(generate_latest(self.registry))


@contextlib.contextmanager
def serving(addr: str, port: int) -> Iterator[Metrics]:
    """Serve the job's metrics while inside (PORT 0: one chosen free); `update` them."""
    try:
        server = BoundedServer(addr, port, content_type=CONTENT_TYPE_LATEST)
    except OSError as e:
        raise UsageError(
            f"--metrics-port {port} on {addr}: {e.strerror or e}",
            hint="pick another port, or 0 for any free one",
        ) from None
    server.start()
    try:
        yield Metrics(server)
    finally:
        server.close(SHUTDOWN_TIMEOUT_S)
