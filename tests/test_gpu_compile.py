"""The engine's kernels compile for an H100/H200 (sm_90) on this machine, GPU or not.

Triton's interpreter, which runs every other kernel test on a CPU, accepts code the GPU compiler
refuses; `engine.tools.compile_check` runs the real compiler down to the cubin instead. One
subprocess, about 10 s cold (a fresh Triton cache).
"""
import pytest

import engine.attention as attention_pkg

needs_triton = pytest.mark.skipif(not attention_pkg.triton_installed(), reason="triton is Linux-only")


@needs_triton
def test_engine_kernels_compile_for_sm90_without_spilling(tmp_path, monkeypatch):
    from engine.tools.compile_check import run_in_subprocess
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))     # compile for real, not from an earlier run's cache
    status, lines = run_in_subprocess("--quick", "--arch", "90")
    kernels = [line for line in lines if "kernel" in line]
    assert status == 0, [line for line in kernels if not line["ok"]]
    assert {line["kernel"] for line in kernels} == {"paged_decode_grouped_kernel", "merge_splits_kernel",
                                                    "paged_prefill_kernel"}
    products = {(line["constexprs"]["USE_DOT"], line["constexprs"]["SPLIT"]) for line in kernels
                if line["kernel"] == "paged_decode_grouped_kernel"}
    assert products == {(False, False), (False, True), (True, True)}       # "sum" split or not, "dot" split
    for line in kernels:
        assert line["registers"] > 0 and line["spill_stack_bytes"] == 0 and line["local_bytes"] == 0, line
    assert lines[-1] == {"arch": "sm_90", "card": "H100/H200", "compiled": len(kernels), "failed": 0, "spilling": 0}


PLANTED = '''
import torch
from engine.tools.compile_check import _compile_mode
records = []
_compile_mode(90, records)
import triton
import triton.language as tl

@triton.jit
def column_sums(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = 0.0                              # a Python float: the loop turns it into a [BLOCK] tensor
    for row in range(0, n):
        acc = acc + tl.load(x_ptr + row * BLOCK + tl.arange(0, BLOCK))
    tl.store(out_ptr + tl.arange(0, BLOCK), acc)

column_sums[(1,)](torch.zeros(64), torch.zeros(16), 4, BLOCK=16)
assert len(records) == 1 and not records[0]["ok"], records
print("REFUSED", records[0]["error"])
'''


@needs_triton
def test_compile_mode_reports_what_the_interpreter_lets_through(tmp_path):
    """An accumulator started as a Python float and grown into a vector by the loop runs in the interpreter
    and fails to compile: caught."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    script = tmp_path / "planted.py"                      # Triton reads a kernel's source from its file
    script.write_text(PLANTED)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "REFUSED" in result.stdout and "acc" in result.stdout.split("REFUSED", 1)[1], result.stdout
