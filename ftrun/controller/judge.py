"""What ended a generation's watch, judged: journaled, and decided into an `Ending` that says
how the generation goes down (gracefully, at once, or not at all) and what comes after it (the
job's outcome, or a next generation and why).

    every rank exited 0 ───────────▶ succeeded, nothing to tear down
    Ctrl-C / SIGTERM ──────────────▶ stopped, graceful unless asked twice
    a host removed, or one to grow ▶ reconfigured: graceful, relaunch on the new set
    a rank exited 0, others hung ──▶ exit_hang incident: killed, the job succeeded
    a preemption notice ───────────▶ an incident: checkpoint committed (or the grace spent),
                                       graceful, then preempted or requeued (preemption.py)
    a fault ───────────────────────▶ an incident, classified by the fault policy:
                                       fatal ends the job, else killed and restarted

Its own module so that the supervise loop reads as launch, watch, judge, tear down, next: the
decision is here, the acting on it is the loop's.
"""

from __future__ import annotations

from ftrun.controller.evidence import Failure
from ftrun.controller.generation import Ending, GenWatch, Reconfigure, WatchResult
from ftrun.controller.job import JobMachine
from ftrun.controller.policy import Tier
from ftrun.controller.preemption import Preempted
from ftrun.controller.reporting import JobOutcome, OutcomeState, Reporter
from ftrun.controller.stall import ExitHang
from ftrun.controller.stalldesk import StallDesk
from ftrun.journal import Journal


class Judge:
    def __init__(
        self, *, job: JobMachine, stalls: StallDesk, journal: Journal, reporter: Reporter
    ) -> None:
        self.job = job
        self.incidents = job.incidents
        self.stalls = stalls
        self.journal = journal
        self.reporter = reporter

    def __call__(self, watch: GenWatch, result: WatchResult, *, stop_requests: int) -> Ending:
        """Journal what ended the watch and decide what comes after the generation's teardown;
        `stop_requests`: Ctrl-C/SIGTERM so far (a second one skips the grace period)."""
        if result is OutcomeState.SUCCEEDED:
            return Ending("succeeded", None, job=JobOutcome.succeeded("every rank exited 0"))
        if result is OutcomeState.STOPPED:  # with the grace period, unless asked twice
            return Ending("stopped", stop_requests < 2, job=JobOutcome.stopped())
        if isinstance(result, Reconfigure):
            # Planned: the ranks get SIGTERM and the grace period (a script that saves on
            # SIGTERM loses nothing), then the job relaunches on the new set of hosts.
            self.journal.record(
                "reconfigure",
                gen=watch.number,
                why=result.why,
                detail=result.detail,
                step=watch.max_step,
            )
            self.reporter.notice(f"{result.detail}: relaunching on the new set of hosts")
            return Ending("reconfigured", True, why=result.detail)
        incident = self.incidents.open()
        if isinstance(result, Preempted):
            return self._preempted(watch, result, incident)
        if isinstance(result, ExitHang):
            # A rank exited 0 and others did not exit in time: the incident (with their stacks)
            # is recorded, the generation killed, and the job finished. Every rank that exited
            # did so with 0 (a failure would have ended the watch first): succeeded.
            reason = self.stalls.record_exit_hang(watch, result, incident)
            return Ending(
                "exit_hang",
                False,
                incident,
                JobOutcome.succeeded(reason),
                (f"{reason} (incident {incident} has their stacks)", "warning"),
            )
        assert isinstance(result, Failure)
        decision = self.job.classify(watch, result)  # the job machine's (job.py)
        if decision.tier is Tier.FATAL:
            return Ending(
                "failed",
                False,
                incident,
                JobOutcome.failed(decision.reason, watch.root_cause(result)),
                (f"fatal: {decision.reason}", "error"),
            )
        return Ending("failed", False, incident, why=decision.reason, failure=result)

    def _preempted(self, watch: GenWatch, result: Preempted, incident: int) -> Ending:
        """A preemption notice honoured: journaled as an incident (fault = the notice, torn down
        next, relaunched by the requeued job), and the job ends preempted or requeued."""
        requeue = self.incidents.config.requeue
        self.journal.record(
            "fault_detected",
            incident=incident,
            gen=watch.number,
            fault="preempted",
            fault_t=result.notice_t,
            detected_t=result.notice_t,
            signal=result.signal,
            step=watch.max_step,
            step_at_notice=result.step_at_notice,
            committed_step=result.committed_step,
        )
        kept = (
            f"checkpoint of step {result.committed_step} committed"
            if result.committed_step is not None
            else "no checkpoint reported committed"
        )
        reason = f"preempted ({result.signal}): {kept}; " + (
            "requeueing" if requeue else "not requeued (--no-requeue)"
        )
        self.journal.record(
            "fault_classified",
            incident=incident,
            tier="requeue" if requeue else "stop",
            decision="requeue" if requeue else "stop",
            reason=result.why,
        )
        return Ending(
            "preempted",
            True,
            incident,
            JobOutcome.preempted(reason, requeue=requeue),
            (reason, "warning"),
        )
