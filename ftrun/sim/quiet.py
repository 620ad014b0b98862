"""The Reporter of a simulated job: it shows nothing while the job runs.

The controller's objects the simulation drives (the PlanDesk, GenWatch) report to a Reporter as
they do for a real job; a simulation's result is its journal, read when it is over.
"""

from __future__ import annotations

from ftrun.controller.reporting import Reporter


class Quiet(Reporter):
    def rank_output(self, rank: int, lines: list[str]) -> None:
        pass

    def torchrun_output(self, host: str, lines: list[str]) -> None:
        pass

    def notice(self, text: str, *, level: str = "info") -> None:
        pass
