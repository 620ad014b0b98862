#!/usr/bin/env bash
# What only a GPU can check, in one run on a lent machine (NCCL, CUDA, one GPU):
#
#   bash scripts/gpu_check.sh OUTDIR [PARTS]    PARTS: a comma list of the parts below by name,
#                                               default tests,demo,pipeline,bench
#
# 1. the GPU path of ftrun.checkpoint (tests/unit/test_checkpoint_cuda.py) and the CPU tests of
#    the checkpoint manager, under the machine's own torch;
# 2. the demo on NCCL: recipes/gpt_ddp.py under `ftrun launch`, rank 0 SIGKILLed at step 100 by
#    `ftrun chaos`, restarted in place from the snapshot in host memory; `ftrun inspect`;
# 3. the pipeline recipe under `ftrun launch` (one GPU: DP 1 x PP 1; NCCL refuses two ranks on
#    one GPU, so PP 2 needs a machine with two);
# 4. bench: scripts/bench_gpu.py, a snapshot every step against dcp.async_save ($BENCH_ARGS are
#    its options).
#
# It runs with the machine's python3 and torch as they are (nothing can be installed there);
# ftrun comes from this checkout through PYTHONPATH. Each part has its own time limit and the
# script goes on after a failure; the log says which parts failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_check.sh OUTDIR [PARTS]}
parts=",${2:-tests,demo,pipeline,bench},"
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export FTRUN_RUN_DIR
FTRUN_RUN_DIR=$(mktemp -d /tmp/ftrun-gpu-runs.XXXXXX)
trap 'rm -rf "$FTRUN_RUN_DIR" /dev/shm/ftrun-gpu*' EXIT
failed=()
part() {  # part NAME SECONDS CMD...: run, time, and note a failure
    local name=$1 limit=$2
    shift 2
    [[ $parts == *",$name,"* ]] || return 0
    echo "== $name"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@"
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || failed+=("$name")
}

nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name())'
df -h /dev/shm /tmp | tail -n 2

part tests 120 python3 -m pytest -q -p no:cacheprovider -x \
    tests/unit/test_checkpoint_cuda.py ${TESTS-tests/unit/test_checkpoint_manager.py}

demo() {
    python3 -m ftrun launch --job-name gpudemo --nproc-per-node 1 recipes/gpt_ddp.py \
        --steps 300 --dim 512 --layers 4 --context 256 --batch 16 &
    local launcher=$!
    for _ in $(seq 1 600); do  # the job directory appears once the controller starts
        ls -d "$FTRUN_RUN_DIR"/gpudemo-* >/dev/null 2>&1 && break
        sleep 0.1
    done
    python3 -m ftrun chaos gpudemo kill-rank --rank 0 --at-step 100
    wait $launcher
    local rc=$?
    python3 -m ftrun inspect gpudemo
    return $rc
}
part demo 150 bash -c "$(declare -f demo); demo"

part pipeline 120 python3 -m ftrun launch --job-name gpupipe --nproc-per-node 1 \
    recipes/gpt_pipeline.py --steps 40 --layers 8 --dim 512 --context 256 --global-batch 32

# shellcheck disable=SC2086 # BENCH_ARGS is a list of options
part bench "${BENCH_LIMIT:-330}" python3 scripts/bench_gpu.py --json "$out/bench_gpu.json" ${BENCH_ARGS:-}

echo "== failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
