"""The bench command and the simulator: they run, print one JSON line, and say what they are.

No timing is asserted: these runs are far too small and too noisy for that.
"""
import argparse
import json

import pytest

from engine.__main__ import main as cli
from engine.tools import bench, simulate
from engine.tools.contiguous import ContiguousKVCache
from engine.tools.simulate import GPUS, BookkeepingPagedCache, Roofline, load_config

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
    assert cli(["bench", "--simulate", "llama-3-8b", "--gpu", "laptop-8GB"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: llama-3-8b does not fit on laptop-8GB: weights 15.0 GiB")


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


def parse(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("mix", ["sharegpt", "alpaca"])
def test_paper_mixes_keep_the_papers_means_under_max_len(mix):
    workload = bench.make_mix_workload(2000, 0, mix, max_len=1024)
    prompt_mean, output_mean = bench.MIXES[mix]
    assert all(len(prompt) + output <= 1024 for prompt, output in workload)
    assert sum(len(p) for p, _ in workload) / 2000 == pytest.approx(prompt_mean, rel=0.1)
    assert sum(o for _, o in workload) / 2000 == pytest.approx(output_mean, rel=0.1)
    assert workload == bench.make_mix_workload(2000, 0, mix, max_len=1024)      # fixed by the seed


def test_poisson_arrivals():
    times = bench.arrival_times(2000, 4.0, seed=0)
    assert times == sorted(times) and times[0] > 0
    assert times[-1] / 2000 == pytest.approx(1 / 4.0, rel=0.1)                 # mean gap 1 / rate
    assert bench.arrival_times(10, None, 0) is None


def test_cpu_bench_with_a_paper_mix_and_arrivals_says_why_no_band(capsys):
    out = run_bench(capsys, "--requests", "8", "--scale", "0.1", "--slots", "3", "--workload", "sharegpt",
                    "--request-rate", "1000", "--kinds", "max", "paged")
    workload = out["workload"]
    assert workload["name"] == "sharegpt" and workload["arrivals"] == "Poisson, 1000 req/s"
    assert workload["output_mean"] > workload["prompt_mean"]                   # output-heavy, as ShareGPT
    band = out["paper_band"]
    assert isinstance(band["in_band"], bool) and "measured on CPU" in band["why"]
    for run in out["runs"].values():
        assert run["output_tokens"] > 0 and run["normalized_latency_s_per_token"] > 0


def test_simulated_arrivals_count_latency_from_arrival(capsys):
    out = run_bench(capsys, "--simulate", "qwen3-0.6b", "--gpu", "laptop-8GB", "--requests", "40",
                    "--workload", "alpaca", "--request-rate", "2", "--kinds", "max", "paged")
    last_arrival = bench.arrival_times(40, 2.0, 0)[-1]
    for run in out["runs"].values():
        assert run["elapsed_s"] >= last_arrival                                 # the clock waited for them
        assert run["ttft_mean_s"] < 1.0          # a light load: nobody queues for long after arriving


def test_simulation_states_whether_it_lands_in_the_paper_band(capsys):
    out = run_bench(capsys, "--simulate", "llama-2-13b", "--gpu", "A100-40GB", "--requests", "48",
                    "--workload", "sharegpt", "--kinds", "max", "paged")
    band = out["paper_band"]
    assert band["band"] == [2.0, 4.0] and isinstance(band["in_band"], bool)
    assert band["paged/max_output_tokens_per_s"] == out["ratios"]["paged/max"]["output_tokens_per_s"]
    assert {"max_compute_bound_fraction", "paged_kv_share_of_bytes"} <= set(band)
    assert band["why"].startswith(f"{band['paged/max_output_tokens_per_s']}x is ")
    assert 0 <= out["runs"]["paged"]["kv_share_of_bytes"] <= 1


def test_summary_goes_to_stderr(capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.main(parser.parse_args(["--simulate", "qwen3-0.6b", "--gpu", "laptop-8GB",
                                         "--requests", "50", "--kinds", "max", "paged", "--quiet"])) == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 1
    assert captured.err.startswith("SIMULATION") and "paper band (" in captured.err


def test_prefix_label_does_not_claim_scaling(capsys):
    out = run_bench(capsys, "--prefix", "--requests", "4", "--system-len", "32", "--slots", "2")
    assert "lengths scaled" not in out["label"] and "--scale does not apply" in out["label"]
    assert out["workload"]["scaled"] is False


def test_model_config_on_cpu(capsys, tmp_path):
    from engine.checkpoint import tiny_config
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_config(num_layers=1).to_hf()))
    out = run_bench(capsys, "--model-config", str(path), "--requests", "4", "--scale", "0.1", "--slots", "2",
                    "--kinds", "max", "paged")
    assert out["device"] == "cpu" and "-shaped model with random weights" in out["label"]
    assert out["runs"]["paged"]["output_tokens"] == out["runs"]["max"]["output_tokens"] > 0


@pytest.mark.skipif(bench.torch.cuda.is_available(), reason="checks the message when CUDA is absent")
def test_device_cuda_without_cuda_is_a_clear_error(capsys):
    assert cli(["bench", "--device", "cuda", "--requests", "2"]) == 2
    assert capsys.readouterr().err.startswith("error: --device cuda: no CUDA device is available here")


def test_gpu_names_map_to_the_roofline_table():
    names = {"NVIDIA H100 80GB HBM3": "H100-80GB", "NVIDIA H200": "H200",
             "NVIDIA A100-SXM4-40GB": "A100-40GB", "NVIDIA A100 80GB PCIe": "A100-80GB",
             "NVIDIA GeForce RTX 4070 Laptop GPU": "laptop-8GB", "Tesla T4": None}
    assert {name: simulate.gpu_for_device_name(name) for name in names} == names


def test_prediction_for_a_card_runs_the_same_workload_simulated(monkeypatch):
    """The CUDA path's prediction, exercised on a CPU setup with the card's name faked."""
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    args = parse("--requests", "6", "--scale", "0.1", "--slots", "2", "--kinds", "max", "paged")
    setup = bench.Setup(args)
    workload, arrivals, _ = bench.capacity_workload(setup, args)
    prediction = bench.predict(setup, args, workload, arrivals)
    assert prediction["gpu"] == "H100-80GB" and prediction["label"].startswith("SIMULATION")
    assert set(prediction["runs"]) == {"max", "paged"}
    assert all(run["output_tokens_per_s"] > 0 for run in prediction["runs"].values())
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    assert "pass --gpu NAME" in bench.predict(setup, args, workload, arrivals)["skipped"]
