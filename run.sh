#!/usr/bin/env bash
# Front door of the project.
#   ./run.sh            set up (if needed) and run the main job
#   ./run.sh setup      only set up the Python environment
#   ./run.sh test [pytest args]   set up (if needed) and run the test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")"

deps_check='import torch, numpy, tiktoken, huggingface_hub, scipy, matplotlib'

# Picks the interpreter: an active environment that already has every dependency is used as it is;
# otherwise a local .venv is created (CPU torch when there is no NVIDIA GPU).
setup_python() {
    if [ -z "${FORCE_VENV:-}" ] && command -v python3 >/dev/null && python3 -c "$deps_check" 2>/dev/null; then
        PY=$(command -v python3)
        if [ "${1:-}" != need-test ] || "$PY" -c 'import pytest' 2>/dev/null; then
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
    if [ "${1:-}" = need-test ] && ! .venv/bin/python -c 'import pytest' 2>/dev/null; then
        .venv/bin/pip install --quiet -r requirements-test.txt
    fi
    PY=$(pwd)/.venv/bin/python
}

case "${1:-}" in
    setup)
        setup_python need-test
        echo "run.sh: environment ready: $PY"
        ;;
    test)
        shift
        setup_python need-test
        exec "$PY" -m pytest -q "$@"
        ;;
    *)
        setup_python
        echo "run.sh: the study runner is not built yet; checking the bundled demo data instead." >&2
        exec "$PY" -m data.shards data/demo/*.bin
        ;;
esac
