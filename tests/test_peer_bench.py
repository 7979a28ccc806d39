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
