"""The bench command and the simulator: they run, print one JSON line, and say what they are.

No timing is asserted: these runs are far too small and too noisy for that.
"""
import argparse
import json

import pytest

from engine.serve import bench, simulate
from engine.serve.contiguous import ContiguousKVCache
from engine.serve.simulate import GPUS, BookkeepingPagedCache, Roofline, load_config

RUN_FIELDS = {"concurrent_peak", "concurrent_mean", "concurrent_mean_saturated", "kv_utilization_mean",
              "preemptions_recompute", "preemptions_swap", "output_tokens_per_s", "ttft_mean_s"}


def run_bench(capsys, *argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.main(parser.parse_args(list(argv))) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, "the bench prints exactly one JSON line"
    return json.loads(lines[0])


def test_tiny_bench_has_every_field_and_ratio(capsys, tmp_path):
    out = run_bench(capsys, "--requests", "10", "--scale", "0.1", "--slots", "3", "--plot",
                    str(tmp_path / "kv.png"))
    assert out["mode"] == "capacity" and out["simulation"] is False and "MEASURED" in out["label"]
    assert set(out["runs"]) == {"max", "pow2", "oracle", "paged"}
    for run in out["runs"].values():
        assert RUN_FIELDS <= set(run) and run["output_tokens"] > 0
    assert set(out["ratios"]) == {"paged/max", "paged/pow2", "paged/oracle"}
    assert out["runs"]["paged"]["concurrent_peak"] > out["runs"]["max"]["concurrent_peak"] == 3
    assert (tmp_path / "kv.png").stat().st_size > 0


def test_simulation_parses_and_labels_itself(capsys):
    out = run_bench(capsys, "--simulate", "qwen3-0.6b", "--gpu", "laptop-8GB", "--requests", "300",
                    "--kinds", "max", "paged")
    assert out["simulation"] is True and out["label"].startswith("SIMULATION")
    assert out["constants"]["gpu"] == "laptop-8GB" and out["constants"]["kv_bytes_per_token"] == 114688
    paged, static = out["runs"]["paged"], out["runs"]["max"]
    assert paged["output_tokens"] == static["output_tokens"] > 0
    assert out["ratios"]["paged/max"]["concurrent_peak"] > 1


def test_a_model_too_big_for_the_gpu_is_a_clear_error(capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.main(parser.parse_args(["--simulate", "llama-3-8b", "--gpu", "laptop-8GB"])) == 2
    err = capsys.readouterr().err
    assert "llama-3-8b does not fit on laptop-8GB: weights 15.0 GiB" in err


def test_prefix_mode_saves_prefill(capsys):
    out = run_bench(capsys, "--prefix", "--requests", "6", "--system-len", "48", "--scale", "1")
    on, off = out["runs"]["prefix_on"], out["runs"]["prefix_off"]
    assert on["prefix_tokens_saved"] > 0 and off["prefix_tokens_saved"] == 0
    assert on["prompt_tokens_computed"] + on["prefix_tokens_saved"] == off["prompt_tokens_computed"]


def test_roofline_numbers_by_hand():
    config = load_config("llama-3-8b")
    roof = Roofline(config, GPUS["H100-80GB"])
    assert roof.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2                # 128 KiB, as in the seeds
    assert 7.4e9 < roof.weight_bytes / 2 < 8.1e9                    # an 8B model in bf16
    decode = roof.step_seconds([(100, 1, True)])                         # one token: bandwidth-bound
    assert decode == pytest.approx((roof.weight_bytes + 101 * roof.kv_bytes_per_token) / 3350e9)
    prefill = roof.step_seconds([(0, 4096, True)])                       # a long prompt: compute-bound
    assert prefill > 4096 * 2 * roof.matmul_params / 989e12
    with pytest.raises(ValueError, match="does not fit on laptop-8GB"):
        Roofline(config, GPUS["laptop-8GB"]).kv_budget_bytes()


def test_bookkeeping_cache_counts_swapped_blocks():
    cache = BookkeepingPagedCache(num_blocks=8, block_size=4)
    cache.create(0)
    cache.reserve(0, 10)
    cache.lengths[0] = 10                              # no forward: pretend the tokens were written
    assert cache.swap_out(0) == 3 and cache.allocator.num_free == 8
    assert cache.swap_in(0) == 3 and cache.blocks_moved == 6
    cache.free(0)
    assert cache.allocator.num_free == 8


def test_contiguous_policies_and_external_fragmentation():
    config = simulate.load_config("qwen3-0.6b")
    sizes = {p: ContiguousKVCache(config, 1000, p, 512, store=False).region_size(300)
             for p in ("max", "pow2", "oracle")}
    assert sizes == {"max": 512, "pow2": 512, "oracle": 300}
    cache = ContiguousKVCache(config, 100, "oracle", 100, store=False)
    for seq, length in enumerate((30, 30, 30)):
        cache.create(seq, max_length=length)
    cache.free(0)
    cache.free(2)                                      # 70 slots free, but in holes of 30 and 40
    with pytest.raises(MemoryError, match="largest hole 40, 70 slots free"):
        cache.create(9, max_length=50)
    cache.free(1)
    cache.create(9, max_length=100)                    # the holes merged back into one
