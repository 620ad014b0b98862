"""Runs the conformance corpus (tests/conformance/) repeatedly under warm ftrun, cold ftrun and
plain torchrun, with and without a rank SIGKILLed mid-run, and reports hangs and mismatches.

    python scripts/conformance.py --trials 20            # every script, killed runs
    python scripts/conformance.py --trials 3 --no-kill ddp_no_destroy uncaught
    python scripts/conformance.py --trials 30 --no-kill --modes warm ddp_destroy  # exit stalls

Target: 0 hangs, 0 exit stalls and 0 mismatches for ftrun in every row. An exit stall is a rank
that stayed after another exited 0 until ftrun's exit barrier (--exit-timeout) killed it: the
job still succeeds, so it is counted apart. "torch exit race cut": a rank stuck in torch's gloo
destructor deadlock at exit (pytorch#56297), recognised in its native stacks and ended within
seconds by the exit rules (the job succeeds, as its work was done). "torch abort at exit": a
rank that did its work and was then aborted by torch at interpreter exit (pytorch#179291),
counted in every mode, plain torchrun's included (w/c/t), and still counted as a mismatch
where the exit codes then differ. Plain torchrun's own failures to recover a killed run are
counted in their own column, not against ftrun.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import Column, Table

from tests.conformance.runner import CORPUS, MODES, compare, run_one

# Printed a row at a time, as each script's trials end (a full run takes a while).
TABLE = Table(
    [
        Column(key="script", header="script", width=24, align="<"),
        Column(key="trials", header="trials"),
        Column(key="hangs", header="hangs", width=10),
        Column(key="stalls", header="exit stalls", width=12),
        Column(key="raced", header="torch exit race cut", width=20),
        Column(key="aborted", header="torch abort at exit", width=20),
        Column(key="mismatches", header="mismatches"),
        Column(key="anchor_failed", header="torchrun failed"),
        *(Column(key=f"s_{m}", header=f"s/run {m}", spec=".1f") for m in MODES),
    ]
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scripts", nargs="*", help="corpus script names (default: all)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument(
        "--kill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="SIGKILL a rank mid-run (default) or run undisturbed",
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds before a run is a hang")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="launchers to run, comma-separated (without the reference, torchrun unkilled or "
        "cold killed, runs are only checked for hangs and exit stalls)",
    )
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    scripts = [s for s in CORPUS if not args.scripts or s.name in args.scripts]
    if not scripts:
        parser.error(f"no such script; the corpus is: {', '.join(s.name for s in CORPUS)}")
    print(TABLE.header())
    total_bad = 0
    for script in scripts:
        hangs: Counter[str] = Counter()
        stalls: Counter[str] = Counter()
        raced: Counter[str] = Counter()
        aborted: Counter[str] = Counter()
        mismatches: Counter[str] = Counter()
        anchor_failed = 0
        seconds: Counter[str] = Counter()
        examples: list[str] = []
        for _ in range(args.trials):
            outcomes = [run_one(m, script, killed=args.kill, timeout_s=args.timeout) for m in modes]
            problems, anchor = compare(outcomes, killed=args.kill)
            anchor_failed += bool(anchor)
            for o in outcomes:
                seconds[o.mode] += o.seconds
                hangs[o.mode] += o.hung and o.mode != "torchrun"
                stalls[o.mode] += o.stalled
                raced[o.mode] += o.raced
                aborted[o.mode] += o.finalization_abort
            for p in problems:
                mode = p.split(":", 1)[0]
                if "hung" not in p and "exit stall" not in p:
                    mismatches[mode] += 1
                examples.append(p[:400])
        bad = sum(hangs.values()) + sum(stalls.values()) + sum(mismatches.values())
        total_bad += bad
        print(
            TABLE.line(
                {
                    "script": script.name,
                    "trials": args.trials,
                    "hangs": _pair(hangs),
                    "stalls": _pair(stalls),
                    "raced": _pair(raced),
                    "aborted": _pair(aborted) + f"/t{aborted['torchrun']}",
                    "mismatches": _pair(mismatches),
                    "anchor_failed": anchor_failed,
                    **{f"s_{m}": seconds[m] / args.trials for m in MODES},
                }
            ),
            flush=True,
        )
        for example in examples[:3]:
            print(f"    {example}")
    print(
        f"\nftrun hangs + exit stalls + mismatches over all scripts: {total_bad}"
        f" ({'killed' if args.kill else 'undisturbed'} runs, {args.trials} trials each)"
    )
    return 1 if total_bad else 0


def _pair(counts: Counter[str]) -> str:
    return f"w{counts['warm']}/c{counts['cold']}"


if __name__ == "__main__":
    t0 = time.monotonic()
    code = main()
    print(f"({time.monotonic() - t0:.0f} s)")
    sys.exit(code)
