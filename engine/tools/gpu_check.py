"""The GPU check: everything that needs a real GPU, in one prepared run that writes one JSON summary.

    python -m engine.tools.gpu_check [--out PATH] [--parts tests,decode,engine,notebooks] [--dry-run]
    bash engine/tools/gpu_check.sh [PATH]          (the same, with the venv's Python if there is one)

Parts, each run in its own process with a time limit, each failing softly (its error is recorded and
the next part runs):
  tests      the compiled kernel tests: pytest -m gpu on tests/test_kernels.py
  decode     bench_decode at batch 64 x contexts 1k/4k/16k fp16, plus its ladder: GB/s, fraction of the
             card's peak, paged vs contiguous SDPA, every tile config's time
  engine     python -m engine bench --device cuda --model-config qwen3-0.6b --kinds paged max: tokens/s
  notebooks  every chapter's solution notebook executed on the GPU, each timed
The JSON (PATH, or $OUT/gpu_check.json, or build/gpu_check.json) is rewritten after every part, so a
run cut short keeps what it measured. Its "summary" holds the fraction of peak per context, the
engine's tokens/s and each notebook's seconds, and says for each target of issue 21 whether the
measurement met it. Without CUDA (or with --dry-run) the GPU parts are recorded as "skipped: no CUDA"
and only the interpreter check of the decode kernel runs: nothing is timed, no figure is invented.
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from engine.tools.cli_args import Parser, path_text, positive_int, unmakeable_parent

PARTS = ("tests", "decode", "engine", "notebooks")
REPO = Path(__file__).resolve().parents[2]
CONTEXTS = (1024, 4096, 16384)
# Issue 21's targets, checked only against measurements: the fraction of peak at batch 64 x 4k fp16, the
# paged kernel against contiguous SDPA on the same data, and the engine's paged tokens/s against Max's.
TARGET_FRACTION_4K, TARGET_VS_SDPA = 0.70, 0.80


def default_out() -> Path:
    """$OUT/gpu_check.json where the caller gives a folder in $OUT, else build/gpu_check.json."""
    folder = os.environ.get("OUT")
    return Path(folder) / "gpu_check.json" if folder else REPO / "build" / "gpu_check.json"


def gpu_environ() -> dict[str, str]:
    """This environment, compiled kernels (no interpreter), nothing fetched from the network."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYDEVD_DISABLE_FILE_VALIDATION="1")
    return env


def run_command(argv: list[str], timeout: float) -> tuple[int, str, str, float]:
    """(exit status, stdout, stderr, seconds) of a command run from the repository; 124 when it timed out."""
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=REPO, env=gpu_environ(), capture_output=True, text=True, timeout=timeout)
        status, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        status = 124
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = f"timed out after {timeout:g} s"
    return status, out, err, round(time.perf_counter() - started, 1)


def json_lines(text: str) -> list[dict]:
    """The JSON objects among a command's output lines (progress bars and notes skipped)."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return found


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ---- the parts ---------------------------------------------------------------------------------------

def environment() -> dict:
    """The machine: GPU, versions, the card's peak bandwidth as bench_decode knows it."""
    from engine.attention import triton_installed
    from engine.tools.bench_decode import peak_bandwidth
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available()}
    if triton_installed():
        import triton
        info["triton"] = triton.__version__
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        props = torch.cuda.get_device_properties(0)
        info.update(device=name, sm_count=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2**30, 1), peak_gbs=peak_bandwidth(name))
        if info["peak_gbs"] is None:
            info["note"] = f"unknown peak bandwidth for {name!r}: fractions of peak are left out"
    return info


def gpu_tests(timeout: float) -> dict:
    """pytest -m gpu: the kernels compiled at model shapes, every dtype and split count."""
    status, out, err, seconds = run_command(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/test_kernels.py"],
        timeout)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", out)}
    return {"status": "ok" if status == 0 else "failed", "seconds": seconds, **counts,
            **({} if status == 0 else {"output": tail(out + "\n" + err, 30)})}


def decode_bandwidth(timeout: float) -> dict:
    """bench_decode at batch 64 x 1k/4k/16k fp16, with every config candidate timed, and the ladder."""
    argv = [sys.executable, "-m", "engine.tools.bench_decode", "--batch", "64", "--contexts",
            *map(str, CONTEXTS), "--ladder"]
    status, out, err, seconds = run_command(argv, timeout)
    lines = json_lines(out)
    result = {"status": "ok" if status == 0 else "failed", "seconds": seconds, "lines": lines}
    if status != 0:
        result["output"] = tail(err)
    return result


def engine_bench(timeout: float, device: str = "cuda", model_config: str | None = "qwen3-0.6b",
                 extra: tuple[str, ...] = ()) -> dict:
    """The serving engine on the GPU with a Qwen3-0.6B-shaped random model: paged vs Max tokens/s.

    (`device`, `model_config` and `extra` let the test run the same parsing on a tiny CPU run.)
    """
    argv = [sys.executable, "-m", "engine", "bench", "--device", device, "--kinds", "paged", "max", "--quiet",
            *(["--model-config", model_config] if model_config else []), *extra]
    status, out, err, seconds = run_command(argv, timeout)
    result = {"status": "ok" if status == 0 else "failed", "seconds": seconds, "command": " ".join(argv[1:])}
    report = next((line for line in reversed(json_lines(out)) if "runs" in line), None)
    if report:
        runs = report["runs"]
        result["tokens_per_s"] = {kind: runs[kind].get("output_tokens_per_s") for kind in runs}
        result["elapsed_s"] = {kind: runs[kind].get("elapsed_s") for kind in runs}
        result["label"] = report.get("label")
    if status != 0:
        result["output"] = tail(err)
    return result


def notebooks(timeout: float, chapters: list[str] | None = None) -> dict:
    """Every chapter's full solution, executed on this machine's GPU (the course's command
    engine/course/authoring/run_chapters.py, in its own process); seconds each, the first error if any."""
    argv = [sys.executable, "-m", "engine.course.authoring.run_chapters", "--timeout", str(int(timeout)),
            *(["--chapters", ",".join(chapters)] if chapters else [])]
    status, out, err, seconds = run_command(argv, timeout * 50)      # timeout is per cell
    report = next((line for line in reversed(json_lines(out)) if "chapters" in line), None)
    if report is None:
        return {"status": "failed", "seconds": seconds, "output": tail(out + "\n" + err)}
    return report


def chapter_names() -> list[str]:
    """The chapters' names, from the course's own listing (engine/course/authoring/run_chapters.py --list); [] when
    it cannot list them."""
    status, out, _, _ = run_command([sys.executable, "-m", "engine.course.authoring.run_chapters", "--list"], 120)
    return json.loads(out) if status == 0 else []


# ---- the summary ---------------------------------------------------------------------------------------

def summarize(parts: dict) -> dict:
    """Fraction of peak per context, the engine's tokens/s, notebook seconds, and each target's verdict."""
    summary: dict = {"device": parts.get("environment", {}).get("device", "cpu")}
    lines = parts.get("decode", {}).get("lines", [])
    per_context = {}
    for line in lines:
        if "impl" in line and "ladder" not in line:
            per_context.setdefault(str(line["context"]), {})[line["impl"]] = {
                key: line.get(key) for key in ("gbs", "fraction_of_peak", "vs_sdpa", "config", "num_splits")}
    if per_context:
        summary["decode_batch64_fp16"] = per_context
    tokens = parts.get("engine", {}).get("tokens_per_s")
    if tokens:
        summary["engine_tokens_per_s"] = tokens
        summary["engine_bench_seconds"] = parts["engine"].get("seconds")
    chapters = parts.get("notebooks", {}).get("chapters")
    if chapters:
        summary["notebook_seconds"] = {name: run["seconds"] for name, run in chapters.items()}
    summary["targets"] = targets(per_context, tokens)
    summary["failed_parts"] = [name for name, part in parts.items() if part.get("status") == "failed"]
    return summary


def targets(per_context: dict, tokens: dict | None) -> dict:
    """Each target of issue 21: met, not met, or "not measured" (never assumed)."""
    at_4k = per_context.get("4096", {})
    paged = max((row for impl, row in at_4k.items() if impl.startswith("paged")),
                key=lambda row: row.get("gbs") or 0, default=None)

    def verdict(value, bound):
        return "not measured" if value is None else ("met" if value >= bound else "not met")

    return {
        f"paged kernel >= {TARGET_FRACTION_4K:.0%} of peak at batch 64 x 4k fp16":
            verdict(paged and paged.get("fraction_of_peak"), TARGET_FRACTION_4K),
        f"paged kernel >= {TARGET_VS_SDPA}x contiguous SDPA at batch 64 x 4k fp16":
            verdict(paged and paged.get("vs_sdpa"), TARGET_VS_SDPA),
        "engine bench: paged >= Max tokens/s":
            verdict(tokens and tokens.get("paged") and tokens.get("max") and tokens["paged"] / tokens["max"], 1.0),
    }


def interpreter_check() -> dict:
    """On a machine without CUDA: bench_decode's small correctness check in Triton's interpreter."""
    status, out, err, seconds = run_command([sys.executable, "-m", "engine.tools.bench_decode"], 300)
    return {"status": "ok" if status == 0 else "failed", "seconds": seconds, "lines": json_lines(out),
            **({} if status == 0 else {"output": tail(err)})}


def run(out: Path, parts: list[str], dry_run: bool, timeout: float, chapters: list[str] | None = None) -> dict:
    """Run the parts in order, each failing softly; rewrite `out` after each; return the whole record."""
    cuda = torch.cuda.is_available() and not dry_run
    record: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "dry_run": dry_run, "parts": {}}
    steps = {"tests": lambda: gpu_tests(timeout), "decode": lambda: decode_bandwidth(timeout),
             "engine": lambda: engine_bench(timeout), "notebooks": lambda: notebooks(timeout, chapters)}
    todo = [("environment", environment)] + [(name, steps[name]) for name in parts]
    for name, step in todo:
        started = time.perf_counter()
        if name != "environment" and not cuda:
            result = {"status": "skipped: no CUDA" if not dry_run else "skipped: --dry-run"}
            if name == "decode":
                result["interpreter_check"] = interpreter_check()
        else:
            try:
                result = step()
            except Exception as exc:  # noqa: BLE001 - fail soft: record it, go on with the next part
                result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        result.setdefault("status", "ok")
        result.setdefault("seconds", round(time.perf_counter() - started, 1))
        record["parts"][name] = result
        record["summary"] = summarize(record["parts"])
        write(out, record)
        print(f"gpu_check: {name}: {result['status']} ({result['seconds']} s)", file=sys.stderr, flush=True)
    return record


def write(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")


def out_path(given: Path | None) -> tuple[Path, str]:
    """(the JSON file to write, why it cannot be: '' when it can) for --out, else $OUT, else build/."""
    if given is None and os.environ.get("OUT", "").strip():     # an empty $OUT is no $OUT (make exports OUT=)
        name, text = "$OUT", os.environ["OUT"]
        folder = Path(text)
        if folder.exists() and not folder.is_dir():
            return folder, f"$OUT {text} is a file: it names the folder that holds gpu_check.json"
        out = folder / "gpu_check.json"
    else:
        name, out = "argument --out:", given or default_out()
        if out.is_dir() or (not out.suffix and not out.exists()):
            out = out / "gpu_check.json"
        elif out.exists() and not out.is_file():
            return out, f"{name} {out} is not a regular file"
        elif out.is_file() and out.suffix.lower() != ".json":
            return out, f"{name} {out} is a file that does not end in .json: name a folder, or a .json file"
    blocking = unmakeable_parent(out)         # the folders it makes must be makeable
    if blocking:
        return out, f"{name} {given if given is not None else out}: {blocking} is a file, not a folder"
    return out, ""


def main(argv: list[str] | None = None) -> int:
    """Run the GPU check; 0 when every part ran (or was skipped for want of CUDA), 1 when one failed, 2 (one
    `error:` line, before any part runs) for a bad argument."""
    p = Parser(prog="python -m engine.tools.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=path_text("--out", "the JSON file or a folder for gpu_check.json", why=""),
                   default=None, help="the JSON file, or a folder to hold gpu_check.json "
                                      "[$OUT/gpu_check.json, else build/gpu_check.json]")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, in order, each once, from "
                                                            f"{','.join(PARTS)}")
    p.add_argument("--chapters", default=None, help="notebooks: only these chapters (e.g. ch06,ch07); needs "
                                                    "notebooks in --parts")
    p.add_argument("--timeout", type=positive_int, default=600, help="seconds per part (per cell for notebooks)")
    p.add_argument("--dry-run", action="store_true", help="skip the GPU parts even where CUDA is present")
    try:
        args = p.parse_args(argv)
        parts = [name.strip() for name in args.parts.split(",") if name.strip()]
        unknown = [name for name in parts if name not in PARTS]
        if unknown or not parts:
            p.error(f"argument --parts: {','.join(unknown) or repr(args.parts)} is not a list of {','.join(PARTS)}")
        twice = sorted({name for name in parts if parts.count(name) > 1})
        if twice:
            p.error(f"argument --parts: {','.join(twice)} is given twice in {args.parts} (give each part once)")
        chapters = None
        if args.chapters is not None:
            chapters = [name.strip() for name in args.chapters.split(",") if name.strip()]
            if "notebooks" not in parts:
                p.error(f"argument --chapters: {args.chapters} applies to the notebooks part, which --parts "
                        f"{args.parts} leaves out")
            names = chapter_names()
            missing = [c for c in chapters if not any(name.startswith(c) for name in names)]
            if missing or not chapters:
                p.error(f"argument --chapters: {','.join(missing) or repr(args.chapters)} names no chapter "
                        f"(have {', '.join(names)})")
            if len(set(chapters)) != len(chapters):
                p.error(f"argument --chapters: {args.chapters} names a chapter twice (give each once)")
        out, why = out_path(args.out)
        if why:
            p.error(why)
    except SystemExit as stop:
        return stop.code
    record = run(out, parts, args.dry_run, args.timeout, chapters)
    print(json.dumps(record["summary"], indent=1))
    print(f"gpu_check: wrote {out}", file=sys.stderr)
    return 1 if record["summary"]["failed_parts"] else 0


if __name__ == "__main__":
    sys.exit(main())
