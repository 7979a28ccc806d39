#!/usr/bin/env bash
# Everything that needs a real GPU, in one prepared run (about 5-10 minutes on an H100/H200), one JSON:
#   1. the `gpu` tests of tests/test_kernels.py, compiled (not interpreted) at Qwen3-like shapes;
#   2. bench_decode at batch 64 x contexts 1k/4k/16k fp16: paged Triton vs contiguous SDPA, GB/s, fraction of peak;
#   3. python -m engine bench --device cuda --model-config qwen3-0.6b (paged vs Max tokens/s);
#   4. every chapter's solution notebook executed on the GPU, each timed.
# Usage, from anywhere:  bash engine/tools/gpu_check.sh [OUT.json | folder] [--parts tests,decode,...]
# Without a path it writes $OUT/gpu_check.json, or build/gpu_check.json. A failing part is recorded and the
# next one runs; without CUDA the GPU parts are recorded as skipped (python -m engine.tools.gpu_check --help).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  PY=python3
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "error: no .venv here and $PY has no torch: run make setup first (or install torch and triton for $PY)" >&2
    exit 2
  fi
fi
unset TRITON_INTERPRET  # compile the kernels; the interpreter is for machines without a GPU
args=()
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then args=(--out "$1"); shift; fi
exec "$PY" -m engine.tools.gpu_check "${args[@]}" "$@"
