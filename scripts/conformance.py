"""Runs the conformance corpus (tests/conformance/) repeatedly under warm ftrun, cold ftrun and
plain torchrun, with and without a rank SIGKILLed mid-run, and reports hangs and mismatches.

    python scripts/conformance.py --trials 20            # every script, killed runs
    python scripts/conformance.py --trials 3 --no-kill ddp_no_destroy uncaught

Target: 0 hangs and 0 mismatches for ftrun in every row. Plain torchrun's own failures to
recover a killed run are counted in their own column, not against ftrun.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conformance.runner import CORPUS, MODES, compare, run_one  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scripts", nargs="*", help="corpus script names (default: all)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--kill", action=argparse.BooleanOptionalAction, default=True,
                        help="SIGKILL a rank mid-run (default) or run undisturbed")
    parser.add_argument("--timeout", type=float, default=120, help="seconds before a run is a hang")
    args = parser.parse_args()
    scripts = [s for s in CORPUS if not args.scripts or s.name in args.scripts]
    if not scripts:
        parser.error(f"no such script; the corpus is: {', '.join(s.name for s in CORPUS)}")
    print(f"{'script':24} {'trials':>6} {'hangs':>12} {'mismatches':>12} {'torchrun failed':>16}"
          f" {'s/run warm cold torchrun':>26}")
    total_bad = 0
    for script in scripts:
        hangs: Counter[str] = Counter()
        mismatches: Counter[str] = Counter()
        anchor_failed = 0
        seconds: Counter[str] = Counter()
        examples: list[str] = []
        for _ in range(args.trials):
            outcomes = [run_one(m, script, killed=args.kill, timeout_s=args.timeout) for m in MODES]
            problems, anchor = compare(outcomes, killed=args.kill)
            anchor_failed += bool(anchor)
            for o in outcomes:
                seconds[o.mode] += o.seconds
                hangs[o.mode] += o.hung and o.mode != "torchrun"
            for p in problems:
                mode = p.split(":", 1)[0]
                if "hung" not in p:
                    mismatches[mode] += 1
                examples.append(p[:400])
        bad = sum(hangs.values()) + sum(mismatches.values())
        total_bad += bad
        per_run = " ".join(f"{seconds[m] / args.trials:6.1f}" for m in MODES)
        print(f"{script.name:24} {args.trials:6} {_pair(hangs):>12} {_pair(mismatches):>12}"
              f" {anchor_failed:16} {per_run:>26}", flush=True)
        for example in examples[:3]:
            print(f"    {example}")
    print(f"\nftrun hangs + mismatches over all scripts: {total_bad}"
          f" ({'killed' if args.kill else 'undisturbed'} runs, {args.trials} trials each)")
    return 1 if total_bad else 0


def _pair(counts: Counter[str]) -> str:
    return f"w{counts['warm']}/c{counts['cold']}"


if __name__ == "__main__":
    t0 = time.monotonic()
    code = main()
    print(f"({time.monotonic() - t0:.0f} s)")
    sys.exit(code)
