#!/usr/bin/env bash
# The paged attention kernels on a real GPU, in one prepared run (a few minutes):
#   1. the `gpu` tests of tests/test_kernels.py, compiled (not interpreted) at Qwen3-like shapes;
#   2. the decode bandwidth benchmark (JSON lines); extra arguments go to it, e.g. --peak-gbs 3350.
# Usage, from anywhere on a machine with CUDA:  bash engine/attention/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
unset TRITON_INTERPRET  # compile the kernels; the interpreter is for machines without a GPU
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device here')"
"$PY" -c "import torch, triton; print('gpu_check:', torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
"$PY" -m pytest -m gpu tests/test_kernels.py -q -p no:cacheprovider
"$PY" -m engine.attention.bench_decode "$@"
