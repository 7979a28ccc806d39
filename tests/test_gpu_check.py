"""engine/tools/gpu_check.py on a machine without a GPU: the JSON it writes, its fail-soft runner, and
the parsing of each part's output (fed by the real commands on tiny CPU runs, so no figure is invented).
"""
import json

import pytest
import torch

import engine.attention as attention_pkg
from engine.tools import bench_decode, gpu_check

needs_triton = pytest.mark.skipif(not attention_pkg.triton_installed(), reason="triton is Linux-only")


@needs_triton
def test_dry_run_writes_one_json_with_the_gpu_parts_skipped(tmp_path):
    status = gpu_check.main(["--dry-run", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert status == 0 and record["dry_run"] is True
    assert list(record["parts"]) == ["environment", "tests", "decode", "engine", "notebooks"]
    for name in ("tests", "engine", "notebooks"):
        assert record["parts"][name]["status"] == "skipped: --dry-run"
    assert record["parts"]["decode"]["interpreter_check"]["lines"][1]["ok"] is True
    assert record["summary"]["failed_parts"] == []
    assert set(record["summary"]["targets"].values()) == {"not measured"}


def test_a_failing_part_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)       # as on a GPU machine
    monkeypatch.setattr(gpu_check, "environment", lambda: {"device": "NVIDIA H200"})
    monkeypatch.setattr(gpu_check, "gpu_tests", lambda timeout: 1 / 0)
    monkeypatch.setattr(gpu_check, "engine_bench", lambda timeout: {"tokens_per_s": {"paged": 2.0, "max": 1.0}})
    out = tmp_path / "x.json"
    record = gpu_check.run(out, ["tests", "engine"], dry_run=False, timeout=5)
    assert record["parts"]["tests"] == {"status": "failed", "error": "ZeroDivisionError: division by zero",
                                        "seconds": record["parts"]["tests"]["seconds"]}
    assert record["parts"]["engine"]["status"] == "ok"
    assert record["summary"]["failed_parts"] == ["tests"]
    assert record["summary"]["targets"]["engine bench: paged >= Max tokens/s"] == "met"
    assert json.loads(out.read_text()) == record


def test_engine_bench_part_reads_the_commands_json():
    """The same parser a GPU run uses, on the real command's output from a tiny CPU run."""
    part = gpu_check.engine_bench(300, device="cpu", model_config=None, extra=("--requests", "4"))
    assert part["status"] == "ok", part
    assert set(part["tokens_per_s"]) == {"paged", "max"} and all(v > 0 for v in part["tokens_per_s"].values())


@needs_triton
def test_summary_reads_bench_decode_rows():
    """Rows as bench_decode prints them (made on the CPU with a stand-in timer), summarized per context."""
    attention_pkg.prepare_triton()
    rows = bench_decode.bench_context(1, 20, torch.float32, peak_gbs=0.1, device="cpu", timer=lambda run: 1.0)
    lines = [dict(row, context=4096) for row in rows]
    summary = gpu_check.summarize({"environment": {"device": "x"}, "decode": {"lines": lines}})
    assert set(summary["decode_batch64_fp16"]["4096"]) == {"sdpa_contiguous", "paged_triton", "paged_triton_tuned"}
    verdicts = summary["targets"]
    assert verdicts["paged kernel >= 70% of peak at batch 64 x 4k fp16"] == "met"       # the stand-in's figures
    assert verdicts["paged kernel >= 0.8x contiguous SDPA at batch 64 x 4k fp16"] == "met"
    assert verdicts["engine bench: paged >= Max tokens/s"] == "not measured"


def test_bad_parts_are_refused(capsys):
    assert gpu_check.main(["--parts", "tests,gpu"]) == 2
    assert capsys.readouterr().err == "error: argument --parts: gpu is not a list of tests,decode,engine,notebooks\n"


def test_notebook_part_times_a_chapter_and_reports_its_first_error(tmp_path):
    """run_notebook (the course's run_chapters, which the notebooks part runs in its own process) on the
    fixture chapter (a second or two), as written and with a planted error."""
    from engine.course.authoring.run_chapters import run_notebook
    from fixtures.course_support import FIXTURE_CHAPTER, REPO
    assert run_notebook(FIXTURE_CHAPTER, 60)["status"] == "ok"
    broken = tmp_path / "solutions" / "ch99_fixture.py"
    broken.parent.mkdir()
    (tmp_path / "tests").symlink_to(REPO / "tests")               # the chapter includes tests/fixtures/...
    broken.write_text(FIXTURE_CHAPTER.read_text().replace("    return 2 * x", "    raise ValueError('planted')"))
    run = run_notebook(broken, 60)
    assert run["status"] == "failed" and run["error"] == "ValueError: planted" and run["seconds"] > 0


def test_notebooks_part_reads_the_course_commands_json_and_chapters_are_listed(monkeypatch):
    """The notebooks part runs engine.course.authoring.run_chapters in its own process and keeps its JSON; --chapters
    is checked against the course's own listing."""
    names = gpu_check.chapter_names()
    assert names and all(name.startswith("ch") for name in names)
    report = {"status": "ok", "chapters": {"ch01_x": {"status": "ok", "seconds": 1.0}}}
    monkeypatch.setattr(gpu_check, "run_command", lambda argv, timeout: (0, "note\n" + json.dumps(report), "", 1.0))
    assert gpu_check.notebooks(60, ["ch01"]) == report
