#!/usr/bin/env bash
# The demo: train the GPT recipe on 2 local ranks, SIGKILL rank 1 mid-run, watch ftrun restart
# the job in place from the snapshot it kept in host memory, then show what `ftrun inspect`
# recorded (the step restored, from which tier, and the steps lost).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python   # the venv setup.sh made ($PYTHON, if set, only chose its interpreter)
# The job goes where every ftrun job goes ($FTRUN_RUN_DIR, else ~/.ftrun/runs), so that
# `ftrun status` and `ftrun inspect` find it afterwards.
run_dir=$("$PY" -c 'from ftrun.config import resolve_run_dir; print(resolve_run_dir(None))')
name="demo-$(date +%Y%m%d-%H%M%S)"
echo "== ftrun demo: job $name under $run_dir"

"$PY" -m ftrun launch --job-name "$name" --nproc-per-node 2 recipes/gpt_ddp.py --steps 300 &
launcher=$!
trap 'kill -INT $launcher 2>/dev/null || true; wait $launcher 2>/dev/null || true' EXIT

# Wait (at most 120 s) until rank 0 has logged step 100, then kill rank 1 of generation 1.
job_dir=""
for _ in $(seq 1 1200); do
    job_dir=$(ls -d "$run_dir/$name"-* 2>/dev/null | head -n 1 || true)
    if [ -n "$job_dir" ] && grep -qs "^step 100 " "$job_dir/logs/g1/rank0.log"; then break; fi
    sleep 0.1
done
pid=$("$PY" - "$job_dir/events.jsonl" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
print(next(e["pid"] for e in events if e["kind"] == "rank_started" and e["gen"] == 1 and e["rank"] == 1))
PY
)
echo "== demo: SIGKILL rank 1 (pid $pid) at step 100"
kill -KILL "$pid"

wait $launcher
trap - EXIT
echo
echo "== ftrun inspect $(basename "$job_dir")"
"$PY" -m ftrun inspect "$(basename "$job_dir")"
