#!/usr/bin/env bash
# Front door of the project.
#   ./run.sh                      set up (if needed) and run the main job: on CUDA GPUs the record study (its
#                                 FineWeb shards downloaded first when missing), elsewhere the CPU demo
#   ./run.sh demo [options]       the CPU demo study, on any machine (options as for a study)
#   ./run.sh gpu-check [--budget S]  qualify a CUDA node and time each base in one call (default 480 s): cold
#                                 compiles side by side as memory allows, then each run alone; FlexAttention and
#                                 varlen against the dense mask (--plan: the stages only, on any machine)
#   ./run.sh STUDY [options]      run a study of ablations/ and write its report (options: python -m ablations run -h;
#                                 --until-decided [--max-seeds N]: seeds in batches until every arm is decided)
#   ./run.sh status STUDY         done / running / failed / to do per arm
#   ./run.sh slurm STUDY [opts]   write a Slurm batch script for the study
#   ./run.sh --help               this help and the list of studies
#   ./run.sh setup                only set up the Python environment
#   ./run.sh python [args]        python in that environment, e.g. ./run.sh python train_gpt_medium.py --preset tiny
#   ./run.sh test [pytest args]   set up (if needed) and run the test suite (what CI runs); ends with its
#                                 CPU-minutes, wall time and machine (SPEEDRUN_TEST_COSTS=FILE keeps each test's cost)
#   ./run.sh test --fast [args]   only the fast tier: the tests not marked slow (no process started; minutes)
#   ./run.sh test --full [args]   the whole suite with every compile-matrix cell through CPU inductor (not in CI)
set -euo pipefail
cd "$(dirname "$0")"

deps_check='import torch, numpy, tiktoken, huggingface_hub, scipy, matplotlib'
test_deps_check='import pytest, xdist, statsmodels'

# Picks the interpreter: an active environment that already has every dependency is used as it is;
# otherwise a local .venv is created (CPU torch when there is no NVIDIA GPU).
setup_python() {
    if [ -z "${FORCE_VENV:-}" ] && command -v python3 >/dev/null && python3 -c "$deps_check" 2>/dev/null; then
        PY=$(command -v python3)
        if [ "${1:-}" != need-test ] || "$PY" -c "$test_deps_check" 2>/dev/null; then
            return
        fi
    fi
    if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "$deps_check" 2>/dev/null; then
        echo "run.sh: creating .venv and installing dependencies" >&2
        python3 -m venv .venv
        .venv/bin/pip install --quiet --upgrade pip >/dev/null 2>&1 || true
        if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
            .venv/bin/pip install --quiet "torch>=2.11,<2.14"
        else
            # The CPU build: on this project's CPU machines this version is a local wheel.
            .venv/bin/pip install --quiet "${TORCH_CPU_SPEC:-torch==2.13.0}"
        fi
        .venv/bin/pip install --quiet -r requirements.txt
    fi
    if [ "${1:-}" = need-test ] && ! .venv/bin/python -c "$test_deps_check" 2>/dev/null; then
        .venv/bin/pip install --quiet -r requirements-test.txt
    fi
    PY=$(pwd)/.venv/bin/python
}

gpu_count() {
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        nvidia-smi -L | grep -c '^GPU ' || true
    else
        echo 0
    fi
}

# The record study: the medium track reads ~2.93B training tokens, 30 train shards of 100M tokens (200 MB each).
RECORD_TRAIN_SHARDS=30
SHARD_MB=200

record_shards_present() {
    [ -f data/fineweb10B/fineweb_val_000000.bin ] || return 1
    local i
    for i in $(seq 1 "$RECORD_TRAIN_SHARDS"); do
        [ -f "$(printf 'data/fineweb10B/fineweb_train_%06d.bin' "$i")" ] || return 1
    done
}

# On CUDA GPUs the record study, after fetching its shards when they are missing; anywhere else the demo.
main_job() {
    setup_python
    local gpus
    gpus=$(gpu_count)
    if [ "$gpus" -eq 0 ]; then
        demo_job "no CUDA GPU here (nvidia-smi -L finds none)"
    fi
    if ! record_shards_present; then
        local fetch="python data/cached_fineweb10B.py $RECORD_TRAIN_SHARDS" problem
        if problem=$("$PY" -c 'from data.cached_fineweb10B import hub_connection_problem as p; print(p() or "")') \
                && [ -n "$problem" ]; then
            echo "run.sh: the record study needs the FineWeb shards and this node cannot reach the Hugging Face Hub" \
                 "($problem): run '$fetch' on a machine with network and copy data/fineweb10B/ here" >&2
            exit 1
        fi
        echo "run.sh: the record study needs the FineWeb val shard and $RECORD_TRAIN_SHARDS train shards in" \
             "data/fineweb10B/: $((RECORD_TRAIN_SHARDS + 1)) files of $SHARD_MB MB, up to" \
             "$(( (RECORD_TRAIN_SHARDS + 1) * SHARD_MB )) MB to download (valid files already there are kept): $fetch"
        "$PY" data/cached_fineweb10B.py "$RECORD_TRAIN_SHARDS" || {
            echo "run.sh: the download did not complete (see the error lines above); run ./run.sh again to resume" >&2
            exit 1
        }
    fi
    # Each run uses 8 GPUs when the node has them; smaller nodes run the same schedule on fewer processes
    # (the training script accumulates gradients so every world size sees the same tokens per step).
    local nproc=1 n
    for n in 8 4 2; do if [ "$gpus" -ge "$n" ]; then nproc=$n; break; fi; done
    echo "run.sh: main job: the record study ($gpus CUDA GPU(s), FineWeb shards in data/fineweb10B/;" \
         "$nproc GPU(s) per run), then its report and result in runs/record/"
    exec "$PY" -m ablations run record --nproc "$nproc" --report
}

# The demo study on the CPU with the bundled demo text; $1 says why it is the main job here (empty: asked for),
# further arguments go to the runner.
demo_job() {
    local why=$1
    shift
    setup_python
    echo "run.sh: ${why:+main job: }the demo study on the CPU with the bundled demo data${why:+, because $why};" \
         "then its report and result in runs/demo/"
    # Small CPU runs go faster side by side, one thread each, than one after the other on all cores.
    local parallel
    # (nproc would count OMP_NUM_THREADS instead of the cores when it is set.)
    parallel=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
    [ "$parallel" -gt 4 ] && parallel=4
    exec "$PY" -m ablations run demo --gpus 0 --parallel "$parallel" --report "$@"
}

gpu_check() {
    if [ "$(gpu_count)" -eq 0 ] && [[ " $* " != *" --plan "* ]]; then
        echo "run.sh: gpu-check needs a CUDA GPU and nvidia-smi -L finds none here" >&2
        exit 2
    fi
    setup_python
    exec "$PY" benchmarks/gpu_check.py "$@"
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    echo
    echo "Studies (ablations/<name>.toml):"
    # Listing needs only the standard library: any Python 3.11+ will do, no environment set-up first.
    if command -v python3 >/dev/null && python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        python3 -m ablations list
    else
        setup_python
        "$PY" -m ablations list
    fi
}

# setup and help take no arguments: one that was meant for something else is refused, not ignored.
no_arguments() {
    if [ $# -gt 1 ]; then
        echo "run.sh: $1 takes no arguments (got: ${*:2}; see ./run.sh --help)" >&2
        exit 2
    fi
}

case "${1:-}" in
    setup)
        no_arguments "$@"
        setup_python need-test
        echo "run.sh: environment ready: $PY"
        ;;
    test)
        shift
        tier=()
        if [ "${1:-}" = --fast ]; then
            shift
            tier=(-m "not slow")
        elif [ "${1:-}" = --full ]; then
            # What CI cannot hold: every compile-matrix cell through CPU inductor (not only the 7 that hold every
            # kind of operation) besides the whole suite.
            shift
            export COMPILE_MATRIX=inductor
        fi
        setup_python need-test
        # One test worker per core (at most 4: each e2e test starts 2-3 processes of its own); the slow tests are
        # mostly single-threaded Python (tracing, process start-up), so 2 workers on 2 cores halve the wall time.
        cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)  # cores, not a thread setting
        workers=${TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
        # Every run is metered (tests/cost_meter.py): into SPEEDRUN_TEST_COSTS when it names a file (emptied first),
        # else a temporary one; the suite's CPU-minutes, wall time and machine are printed at the end.
        costs=${SPEEDRUN_TEST_COSTS:-}
        if [ -z "$costs" ]; then
            costs=$(mktemp "${TMPDIR:-/tmp}/test-costs.XXXXXX.jsonl")
            trap 'rm -f "$costs"' EXIT
        else
            : > "$costs"
        fi
        started=$(date +%s)
        status=0
        # Bytecode and pytest's rewritten test modules cached on disk (git ignores __pycache__): otherwise every
        # worker and every process a test starts compiles and rewrites them again.
        unset PYTHONDONTWRITEBYTECODE
        # --durations=15: the slowest tests at the end, so a test that grew is seen where it is run.
        SPEEDRUN_TEST_COSTS=$costs "$PY" -m pytest -q -n "$workers" --dist worksteal --durations=15 "${tier[@]}" "$@" \
            || status=$?
        "$PY" benchmarks/suite_costs.py "$costs" --summary --wall-s "$(( $(date +%s) - started ))" || true
        exit "$status"
        ;;
    -h|--help|help)
        no_arguments "$@"
        usage
        ;;
    "")
        main_job
        ;;
    demo)
        shift
        demo_job "" "$@"
        ;;
    gpu-check)
        shift
        gpu_check "$@"
        ;;
    python)
        shift
        setup_python
        exec "$PY" "$@"
        ;;
    status|slurm|list)
        setup_python
        exec "$PY" -m ablations "$@"
        ;;
    -*)
        echo "run.sh: unknown option $1 (see ./run.sh --help)" >&2
        exit 2
        ;;
    *)
        setup_python
        study=$1
        shift
        exec "$PY" -m ablations run "$study" --report "$@"
        ;;
esac
