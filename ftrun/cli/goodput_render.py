"""How goodput looks on a terminal: one table, the job and each generation side by side.

The figures are ftrun.jobview.goodput's; this module only lays them out (`inspect` prints it,
`status --watch` shows the job's ratio).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ftrun.jobview.goodput import BUCKET_LABELS, GoodputReport, Share

# More generations than this are summed into the job column only: a table is for people.
MAX_GENERATION_COLUMNS = 6


def ratio_text(share: Share) -> str:
    """`87.3%`, or `—` before there is any wall time and without a progress signal."""
    return "—" if share.ratio is None else f"{share.ratio:.1%}"


def goodput_table(report: GoodputReport) -> Table:
    """Rows: goodput, then every badput bucket that is not zero somewhere; columns: the job
    (seconds and share of its wall time), then each generation's seconds."""
    gens = sorted(report.generations)
    shown = gens if len(gens) <= MAX_GENERATION_COLUMNS else []
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("")
    table.add_column("job", justify="right")
    table.add_column("share", justify="right")
    for g in shown:
        table.add_column(f"g{g}", justify="right")
    job = report.job
    table.add_row(
        "wall time",
        _secs(job.wall_s),
        "",
        *(_secs(report.generations[g].wall_s) for g in shown),
    )
    table.add_row(
        Text("goodput", style="bold"),
        _productive(job),
        Text(ratio_text(job), style="bold"),
        *(_productive(report.generations[g]) for g in shown),
        style="green",
    )
    if job.unknown is not None:  # no progress signal: what ran, start-up or training
        table.add_row(
            "ran, no steps",
            _secs(job.unknown_s),
            f"{job.unknown_s / job.wall_s:.1%}" if job.wall_s else "",
            *(_secs(report.generations[g].unknown_s) for g in shown),
        )
    for name, label in BUCKET_LABELS.items():
        if not any(s.buckets[name] >= 0.005 for s in (job, *report.generations.values())):
            continue
        table.add_row(
            label,
            _secs(job.buckets[name]),
            f"{job.buckets[name] / job.wall_s:.1%}" if job.wall_s else "",
            *(_secs(report.generations[g].buckets[name]) for g in shown),
        )
    return table


def _productive(share: Share) -> str:
    return "—" if share.unknown is not None else _secs(share.productive_s)


def _secs(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 100:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.2f} s"
