#!/usr/bin/env bash
# The prepared device call of shared/spec/gpu-protocol.md: gpu-check, then ours against upstream #137's own script,
# in one command of about 8 minutes (the machine comes for 15 minutes in all, at most 10 per command).
#
#   benchmarks/gpu_window.sh UPSTREAM_137_LOG            on the GPU machine (from the repository root)
#   benchmarks/gpu_window.sh UPSTREAM_137_LOG --dry-run  anywhere: the plan and the edits, nothing run
#
# UPSTREAM_137_LOG: upstream's #137 record log, kept in the git-ignored upstream/ folder (never committed; the device
# tool carries it with carry=["upstream"]). Environment: OUT (the folder that comes back; default ./gpu-window-out),
# PY (default python3: the machine's own torch), GPU_CHECK_BUDGET (230 s), VS_UPSTREAM_BUDGET (290 s: upstream
# compiles cold, then runs its timed and profiled steps), PROFILE_STEPS (3: steps each side runs under torch.profiler
# after its timed ones, benchmarks/kernel_profile.py; 0 for none), FREE_GIB (--dry-run only: the GPU memory to plan
# with, default 139 = an H200).
# What comes back (at most 8 files, none in a folder): the two results files, env.txt, gpu-samples.csv and
# logs.tar.gz (every child's console and log). Each stage appends its results as it ends: a killed call keeps them.
set -uo pipefail
cd "$(dirname "$0")/.."

log=${1:-}
dry_run=${2:-}
if [ -z "$log" ] || [ "$log" = -h ] || [ "$log" = --help ]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
fi
if [ ! -f "$log" ]; then
    echo "gpu_window.sh: no such upstream record log: $log" >&2
    exit 2
fi
if [ -n "$dry_run" ] && [ "$dry_run" != --dry-run ]; then
    echo "gpu_window.sh: unknown option $dry_run (only --dry-run)" >&2
    exit 2
fi

PY=${PY:-python3}
OUT=${OUT:-gpu-window-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
check_budget=${GPU_CHECK_BUDGET:-230}
vs_budget=${VS_UPSTREAM_BUDGET:-290}
profile_steps=${PROFILE_STEPS:-3}
day=$(date -u +%F)

if [ "$dry_run" = --dry-run ]; then
    "$PY" benchmarks/gpu_check.py --plan --budget "$check_budget" --free-gib "${FREE_GIB:-139}" || exit $?
    "$PY" benchmarks/vs_upstream.py --log "$log" --dry-run --budget "$vs_budget" --work-dir "$work/vs-upstream" \
        --profile-steps "$profile_steps"
    exit $?
fi

{
    date -u
    nvidia-smi || true
    "$PY" -c 'import sys, torch; print(sys.version); print(torch.__version__, torch.version.cuda,
torch.cuda.get_device_name(0), torch.cuda.mem_get_info())'
    git log -1 --format='code: %H %s' 2>/dev/null || true
} > "$OUT/env.txt" 2>&1
gpu=$("$PY" -c 'import torch; from benchmarks.gpu_check import gpu_slug
print(gpu_slug(torch.cuda.get_device_name(0)))' 2>/dev/null || echo gpu)

# A background sampler, stopped by its own PID at the end (never a bare `wait`: it would wait for this too).
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 5 \
    > "$OUT/gpu-samples.csv" 2>/dev/null &
sampler=$!

# Each step also under `timeout`, a little past its own budget (shards, imports, stopping children): a hung step
# cannot eat the call, and with the defaults both end within the 600 s a command may run.
timeout --kill-after=10 $((check_budget + 40)) "$PY" benchmarks/gpu_check.py --budget "$check_budget" \
    --results "$OUT/${day}_${gpu}_gpu-check.txt" --out-dir "$work/gpu-check"
check_status=$?
timeout --kill-after=10 $((vs_budget + 40)) "$PY" benchmarks/vs_upstream.py --log "$log" --budget "$vs_budget" \
    --results "$OUT/${day}_${gpu}_vs-upstream-137.txt" --work-dir "$work/vs-upstream" --profile-steps "$profile_steps"
vs_status=$?

kill "$sampler" 2>/dev/null
# No data, no checkpoints, and nothing of upstream's code (its edited script, and its own logs, which embed it).
tar -czf "$OUT/logs.tar.gz" -C "$work" --exclude='*.bin' --exclude='*.pt' --exclude='upstream_*.py' \
    --exclude='./vs-upstream/logs' . 2>/dev/null
echo "gpu_window.sh: gpu-check exit $check_status, vs_upstream exit $vs_status; results in $OUT"
[ "$check_status" -eq 0 ] && [ "$vs_status" -eq 0 ]
