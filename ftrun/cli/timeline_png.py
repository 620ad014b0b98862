"""`ftrun inspect JOB --png FILE`: the timeline as a static image, drawn with matplotlib.

The same `Timeline` as the HTML page, in the same lanes and colours, for a report or a ticket.
matplotlib is an optional extra (`pip install 'ftrun[plot]'`), imported here only, when an image
is asked for, with the Agg backend (no display). Journal text reaches matplotlib as plain text:
`$` is escaped so that a job or host name cannot switch on mathtext (whose parser would raise
on a malformed formula and end the command with an internal error), and control characters are
shown as escapes.
"""

from __future__ import annotations

import io
import math
from typing import Any

from ftrun.cli.safetext import clean
from ftrun.errors import UsageError
from ftrun.jobview.timeline import Timeline

PHASE_COLOURS = {  # by goodput's labels (ftrun/jobview/phases.py), as timeline.js
    "detection": "#e4572e",
    "teardown": "#f3a712",
    "waiting for hosts": "#8e5ad6",
    "relaunch": "#2a9d8f",
    "restore": "#d6408f",
}
JOINED_PHASE = "#8a94a3"
GEN_FILL = ("#d8e6f6", "#c2d6ef")
GEN_EDGE = "#7d9fc9"
RATE = "#1b5e9e"
COMMIT = "#3d4a5c"
MARKS = {  # kind → (matplotlib marker, colour), as timeline.js draws them
    "host_added": ("^", "#2e8540"),
    "host_joined": ("^", "#2e8540"),
    "host_removed": ("v", "#c0392b"),
    "host_lost": ("x", "#c0392b"),
    "host_unreachable": ("v", "#b7791f"),
    "plan_changed": ("D", "#1b7fc4"),
}
LANES = ("checkpoints", "hosts · plans", "incidents", "generations")  # bottom to top
WIDTH_IN, HEIGHT_IN, DPI = 14, 7, 100
MAX_LABEL = 90


def render_png(timeline: Timeline) -> bytes:
    """The timeline as PNG bytes, 1400 x 700 pixels."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        from matplotlib.ticker import MultipleLocator
    except ImportError as e:
        raise UsageError(
            f"--png needs matplotlib, which is not installed ({e})",
            hint="pip install 'ftrun[plot]' (or use --html, which needs nothing)",
        ) from e
    fig = plt.figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    try:
        grid = fig.add_gridspec(2, 1, height_ratios=(1.25, 2), hspace=0.08)
        lanes = fig.add_subplot(grid[0])
        rate = fig.add_subplot(grid[1], sharex=lanes)
        _lanes(lanes, timeline)
        _rate(rate, timeline)
        span = max(timeline.span, 0.001)
        unit, scale = (
            ("s", 1.0) if span <= 180 else ("min", 60.0) if span <= 3 * 3600 else ("h", 3600.0)
        )
        rate.set_xlim(0, span)
        # Ticks at round numbers of the unit shown (1 h, 2 h: not 1.38889 h).
        rate.xaxis.set_major_locator(MultipleLocator(_round_step(span / scale) * scale))
        rate.xaxis.set_major_formatter(lambda v, _pos: f"{v / scale:g} {unit}")
        rate.set_xlabel("time since the job started")
        fig.suptitle(_title(timeline), x=0.06, ha="left", fontsize=14, fontweight="bold")
        for i, line in enumerate(_summary(timeline)):
            fig.text(0.06, 0.915 - 0.03 * i, _safe(line), fontsize=10.5, color="#3d4a5c")
        handles: list[Any] = [Patch(facecolor=GEN_FILL[1], edgecolor=GEN_EDGE, label="generation")]
        if any(g.starting_end is not None for g in timeline.generations):
            handles.append(
                Patch(facecolor="#e8eff9", edgecolor=GEN_EDGE, label="starting (to its first step)")
            )
        handles += [
            Patch(color=PHASE_COLOURS.get(p, JOINED_PHASE), label=f"incident: {p}")
            for p in timeline.phases
        ]
        handles.append(Line2D([], [], color=RATE, marker="o", markersize=4, label="steps/s"))
        handles.append(
            Line2D([], [], color=COMMIT, marker="|", ms=10, mew=1.5, ls="", label="checkpoint")
        )
        for kind in dict.fromkeys(m.kind for m in timeline.markers):
            shape, colour = MARKS.get(kind, ("D", "#555555"))
            label = timeline.markers_legend.get(kind, kind)
            handles.append(Line2D([], [], color=colour, marker=shape, ls="", label=label))
        ncol = max(6, -(-len(handles) // 2))  # two rows, read across as on the page
        rows = [handles[:ncol], handles[ncol:]]
        across = [r[i] for i in range(ncol) for r in rows if i < len(r)]  # legend fills by column
        fig.legend(
            handles=across,
            loc="upper left",
            bbox_to_anchor=(0.06, 0.865),
            ncol=ncol,
            frameon=False,
            fontsize=9.5,
        )
        fig.subplots_adjust(left=0.1, right=0.98, top=0.75, bottom=0.09)
        out = io.BytesIO()
        fig.savefig(out, format="png", dpi=DPI)
        return out.getvalue()
    finally:
        plt.close(fig)


def _lanes(ax: Any, tl: Timeline) -> None:
    ax.set_ylim(-0.5, len(LANES) - 0.5)
    ax.set_yticks(range(len(LANES)), LANES)
    ax.tick_params(axis="x", labelbottom=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#eef1f5")
    y_gen, y_inc, y_mark, y_ckpt = 3, 2, 1, 0
    for i, g in enumerate(tl.generations):
        width = max(g.end - g.start, tl.span / 1000)
        ax.broken_barh(
            [(g.start, width)],
            (y_gen - 0.38, 0.76),
            facecolors=GEN_FILL[i % 2],
            edgecolors=GEN_EDGE,
            linestyles="--" if g.open else "-",
        )
        stepped = g.start if g.starting_end is None else min(g.starting_end, g.end)
        if stepped > g.start:  # paler: starting, to its first step (not without any steps)
            ax.broken_barh([(g.start, stepped - g.start)], (y_gen - 0.36, 0.72), facecolors="white",
                           alpha=0.55)  # fmt: skip
        label = f"g{g.number} · {', '.join(g.hosts)} · {g.world_size} ranks"
        label += f" · {g.plan}" if g.plan else ""
        chars = int(width / tl.span * WIDTH_IN * 0.8 * DPI / 7)  # ~7 px a character
        if chars >= 3:
            ax.text(
                g.start + tl.span * 0.004,
                y_gen,
                _safe(_fit(label, chars)),
                va="center",
                fontsize=9,
                clip_on=True,
            )
    for inc in tl.incidents:
        ax.axvspan(inc.start, max(inc.end, inc.start + tl.span / 500), color="#e4572e", alpha=0.08)
        for s in inc.segments:
            ax.broken_barh(
                [(s.start, max(s.end - s.start, tl.span / 800))],
                (y_inc - 0.3, 0.6),
                facecolors=PHASE_COLOURS.get(s.phase, JOINED_PHASE),
                alpha=0.55 if s.open else 1.0,
            )
        if not inc.segments:
            ax.plot([inc.start], [y_inc], "|", color=JOINED_PHASE, markersize=14)
        ax.text(
            inc.end + tl.span * 0.005,
            y_inc,
            _safe(f"#{inc.id} {inc.kind}"),
            va="center",
            fontsize=9,
        )
    for m in tl.markers:
        shape, colour = MARKS.get(m.kind, ("D", "#555555"))
        ax.plot([m.t], [y_mark], shape, color=colour, markersize=8, mew=2)
    if tl.commits:
        ax.vlines([c.t for c in tl.commits], y_ckpt - 0.3, y_ckpt + 0.3, color=COMMIT, lw=1.2)
    for y, empty, what in (
        (y_gen, not tl.generations, "no generation launched"),
        (y_inc, not tl.incidents, "no incidents"),
        (y_mark, not tl.markers, "no hosts joined or left, no plan changed"),
        (y_ckpt, not tl.commits, "no checkpoint committed"),
    ):
        if empty:
            ax.text(tl.span * 0.005, y, what, va="center", color="#9aa5b1", style="italic")


def _rate(ax: Any, tl: Timeline) -> None:
    ax.set_ylabel("steps/s")
    ax.grid(color="#eef1f5")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for inc in tl.incidents:
        ax.axvspan(inc.start, max(inc.end, inc.start + tl.span / 500), color="#e4572e", alpha=0.08)
    for g in tl.generations:
        ax.axvline(g.start, color=GEN_EDGE, ls=":", lw=1)
        if g.points:
            xs = [(p.t0 + p.t1) / 2 for p in g.points]
            ys = [p.rate for p in g.points]
            ax.plot(xs, ys, "-o", color=RATE, lw=1.8, markersize=3 if len(xs) < 150 else 1.5)
    ax.set_ylim(0, max(tl.max_rate * 1.15, 1.0))
    if not any(g.points for g in tl.generations):
        ax.text(
            0.5,
            0.5,
            "no steps reported"
            if all(g.first_step is None for g in tl.generations)
            else "too few steps reported to measure a rate",
            transform=ax.transAxes,
            ha="center",
            color="#9aa5b1",
            style="italic",
        )


def _title(tl: Timeline) -> str:
    name = f"  {_fit(tl.name, 60)}" if tl.name else ""
    return _safe(f"ftrun job {tl.job_id}{name}  [{tl.state}]")


def _summary(tl: Timeline) -> list[str]:
    """Two lines under the title: what the job was, and where its time went."""
    n_gen, n_inc = len(tl.generations), len(tl.incidents)
    facts = [
        f"{'running for' if tl.live else 'lasted'} {_dur(tl.span)}",
        f"{n_gen} generation{'s' * (n_gen != 1)}",
        f"{n_inc} incident{'s' * (n_inc != 1)}",
        f"{tl.commits_total} checkpoint commit{'s' * (tl.commits_total != 1)}",
    ]
    if tl.reason:
        facts.append(_fit(f"{tl.state}: {tl.reason}", MAX_LABEL))
    lines = [" · ".join(facts)]
    if tl.goodput is not None:
        g = tl.goodput
        if g["ratio"] is None:  # no progress signal: what ran is not known to be training
            line = f"goodput — ({g['unknown']}): {_dur(g['unknown_s'])} ran without a step"
        else:
            line = f"goodput {100 * g['ratio']:.1f}%: {_dur(g['productive_s'])} productive"
        top = sorted(g["lost"], key=lambda b: -b[1])[:5]  # the biggest losses fit on a line
        if top:
            line += "; lost to " + ", ".join(f"{label} {_dur(s)}" for label, s in top)
        lines.append(line)
    return lines


def _round_step(span: float, most: int = 8) -> float:
    """The smallest of 1, 2, 5 × 10^k that puts at most `most` ticks on `span`."""
    step = 10.0 ** math.floor(math.log10(max(span, 1e-9) / most))
    while span / step > most:
        step *= 2.5 if str(step).lstrip("0.").startswith("2") else 2.0
    return step


def _dur(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{int(s // 3600)} h {round(s % 3600 / 60):02d} min"


def _fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(chars - 1, 0)] + "…"


def _safe(text: str) -> str:
    """Plain text for matplotlib: no mathtext (`$`), no control characters."""
    return clean(text).replace("$", r"\$")
