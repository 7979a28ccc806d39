"""`python -m engine.tools.bench_decode`: options refused before any work, and the GPU benchmark's own
logic (rows, fractions, the tuner, the ladder) run on tiny shapes in Triton's interpreter with a stand-in
timer, so the code a GPU run takes is exercised here. Its figures are meaningless on a CPU; none is asserted.
"""
import json
import subprocess
import sys

import pytest
import torch

import engine.attention as attention_pkg
from engine.tools import bench_decode

needs_triton = pytest.mark.skipif(not attention_pkg.triton_installed(), reason="triton is Linux-only")


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "error: argument --batch: 0 is not a whole number from 1 to 4096"),
    (["--contexts", "1024", "1024"], "error: argument --contexts: 1024 is given twice (give each value once)"),
    (["--contexts", "2000000"], "error: argument --contexts: 2000000 is not a whole number from 1 to 1048576"),
    (["--peak-gbs", "nan"], "error: argument --peak-gbs: nan is not a finite number > 0"),
    (["--splits", "0"], "error: argument --splits: 0 is not a whole number from 1 to 64"),
    (["--dtype", "fp8"], "error: argument --dtype: invalid choice: 'fp8'"),
])
def test_bad_options_are_refused_in_one_line(argv, message, capsys):
    assert bench_decode.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_peak_by_device_name():
    assert bench_decode.peak_bandwidth("NVIDIA H200") == 4800
    assert bench_decode.peak_bandwidth("NVIDIA H100 80GB HBM3") == 3350
    assert bench_decode.peak_bandwidth("NVIDIA H100 PCIe") == 2000
    assert bench_decode.peak_bandwidth("NVIDIA A100-SXM4-80GB") == 2039
    assert bench_decode.peak_bandwidth("NVIDIA A10") == 600
    assert bench_decode.peak_bandwidth("NVIDIA GH200 480GB") is None      # HBM3 or HBM3e: ask
    assert bench_decode.peak_bandwidth("Some Card", override=1234.0) == 1234.0
    assert bench_decode.kv_bytes(64, 4096, torch.float16) == 2 * 64 * 4096 * 8 * 128 * 2


def fake_timer(run):
    """Runs the launch once (so it is exercised) and returns a made-up time."""
    run()
    return 1.0


@needs_triton
def test_gpu_code_paths_on_tiny_shapes():
    """bench_context (default, tuned with every candidate timed) and the ladder, on the CPU."""
    attention_pkg.prepare_triton()
    where = dict(device="cpu", timer=fake_timer)
    rows = bench_decode.bench_context(1, 20, torch.float32, peak_gbs=0.1, **where)
    assert [r["impl"] for r in rows] == ["sdpa_contiguous", "paged_triton", "paged_triton_tuned"]
    for row in rows:
        assert row["max_abs_diff_vs_sdpa"] < 1e-5 and row["vs_sdpa"] == 1.0 and row["fraction_of_peak"] > 1
    assert rows[1]["config"] == "sum/n32/w4/s2" and rows[1]["num_splits"] == 1
    assert len(rows[2]["candidates_ms"]) >= 3
    steps = bench_decode.ladder(1, 20, dtype=torch.float32, **where)
    assert [r["impl"] for r in steps] == ["per_head", "grouped", "grouped_fp16_dot", "split_k", "sdpa_contiguous"]
    assert all(r["max_abs_diff_vs_sdpa"] < 1e-5 for r in steps) and steps[3]["num_splits"] == 2


@needs_triton
def test_without_cuda_it_checks_in_the_interpreter():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the command benchmarks instead")
    result = subprocess.run([sys.executable, "-m", "engine.tools.bench_decode", "--contexts", "64"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert "needs a CUDA device" in lines[0]["note"] and lines[1]["ok"] is True


@needs_triton
def test_chapter_comparison_runs_a_learner_kernel():
    """compare_kernels, the chapter's bandwidth cell, with a plain function as the learner's kernel (fp16)."""
    attention_pkg.prepare_triton()
    from engine.attention.triton_decode import paged_decode_head_program
    rows = bench_decode.compare_kernels(1, 20, kernel=paged_decode_head_program, device="cpu", timer=fake_timer)
    assert [r["impl"] for r in rows] == ["sdpa_contiguous", "per_head_kernel", "grouped_kernel"]
    assert all(r["max_abs_diff_vs_sdpa"] < 5e-3 and r["peak_gbs"] is None for r in rows)
