"""`python -m engine bench-peer` serves one workload through transformers and the engine on the same weights."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")


def test_the_peer_bench_checks_outputs_and_reports_both_speeds():
    result = subprocess.run([sys.executable, "-m", "engine", "bench-peer", "--scale", "0.05", "--hidden", "64",
                             "--layers", "1", "--heads", "4", "2", "--threads", "1"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert set(report["workloads"]) == {"batched", "single", "sharegpt"}
    for name, run in report["workloads"].items():
        assert run["identical_outputs"] is True, (name, run)
        assert run["transformers_tokens_per_s"] > 0 and run["engine_tokens_per_s"] > 0
        assert run["engine/transformers"] == pytest.approx(run["engine_tokens_per_s"]
                                                           / run["transformers_tokens_per_s"], rel=0.05)
    assert report["workloads"]["batched"]["requests"] == 32 and report["workloads"]["single"]["requests"] == 1


def test_a_difference_in_outputs_is_reported_and_fails(monkeypatch):
    from engine.tools import peer_bench
    requests = [([1, 2, 3], 2), ([4, 5], 2)]
    monkeypatch.setattr(peer_bench, "run_transformers", lambda model, reqs: ([[7, 8], [9, 10]], 1.0))
    monkeypatch.setattr(peer_bench, "run_engine", lambda model, reqs, budget: ([[7, 8], [9, 11]], 0.5))
    result = peer_bench.compare("batched", requests, None, None, None)
    assert result["identical_outputs"] is False and result["engine/transformers"] == 2.0
    assert result["first_difference"] == "request 1 at output token 1: transformers 10, engine 11"


def test_both_sides_are_warmed_up_then_timed_alternately_and_the_medians_reported(monkeypatch):
    from engine.tools import peer_bench
    calls, seconds = [], iter([1.0, 9.0, 3.0, 0.5, 0.7, 0.6])    # transformers, engine, transformers, ...
    requests = [([1, 2, 3, 4, 5, 6, 7, 8, 9], 2)]

    def run(side):
        def served(model, reqs, *budget):
            calls.append((side, reqs))
            return [[7, 8]], (0.0 if reqs[0][1] == 2 and len(reqs[0][0]) == 8 else next(seconds))
        return served
    monkeypatch.setattr(peer_bench, "run_transformers", run("transformers"))
    monkeypatch.setattr(peer_bench, "run_engine", run("engine"))
    result = peer_bench.compare("single", requests, None, None, None, repeats=3)
    assert [side for side, _ in calls] == ["transformers", "engine"] * 4
    assert calls[0][1] == calls[1][1] == [([1, 2, 3, 4, 5, 6, 7, 8], 2)]     # the warm-up: 8 tokens, 2 new
    assert result["repeats"] == 3 and result["identical_outputs"] is True
    assert result["engine/transformers"] == pytest.approx(1.0 / 0.6, rel=1e-3)   # median 1.0 over median 0.6


def test_a_repeated_run_that_differs_is_reported(monkeypatch):
    from engine.tools import peer_bench
    outputs = iter([[[1]], [[1]], [[1]], [[2]]])
    monkeypatch.setattr(peer_bench, "warm_up", lambda *args: None)
    monkeypatch.setattr(peer_bench, "run_transformers", lambda model, reqs: (next(outputs), 1.0))
    monkeypatch.setattr(peer_bench, "run_engine", lambda model, reqs, budget: (next(outputs), 1.0))
    result = peer_bench.compare("single", [([1, 2], 1)], None, None, None, repeats=2)
    assert result["identical_outputs"] is False
    assert result["first_difference"] == "a repeated run's outputs differ from the same side's first run"
