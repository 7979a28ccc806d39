"""The grader's host engine holds no implementation of a graded exercise under any name (issue 36).

The host (the process that runs a notebook's cells under make grade and make autograde) imports its own
copy of the engine (engine.course.authoring.edition.host_engine): the chapters before the graded one whole, the
taught bodies of it and of every later chapter stubbed, and of the checks only what the chapter's own
cells use there (edition.host_checks): the checks run in the judge. Every function and method of every
chapter's host engine is compared, by the copy detector (engine.course.grading.reading.likeness: structure, with
names and words set aside), with each taught body of that chapter and the chapters after it; none may be
one. The helper that computes Exercise 8.2's answer for the chapter's figures (ch08.kv_bytes_reference)
is a table of the values those cells print, which refuses any other config.
"""
import ast
import inspect
import json
import subprocess
import sys
import textwrap

import pytest

from engine.checks import ch08
from engine.course import cells
from engine.course.authoring import edition, exercises
from engine.course.grading.reading import likeness
from fixtures.course_support import expanded, once_per_run, real_chapters

CHAPTERS = {path.stem[:4]: path for path in real_chapters()}
JUDGE_ONLY = "runs in the grader's judge"


def taught_bodies(chapter: str) -> dict[str, list[str]]:
    """{"chNN name" or "chNN Class.method": tokens} of each graded name as the chapter's solution cells
    define it: the engine's reference (included into the cell) or the cell's own function."""
    path = CHAPTERS[chapter]
    graded = exercises.plan_for(path).graded()
    found = {}
    for cell in expanded(path).cells:
        if cell.cell_type != "code" or not cells.is_solution(cell) or cells.is_graded(cell):
            continue
        functions, classes = likeness.definitions(cell.source)
        for name, spec in graded.items():
            if not spec["methods"] and name in functions:
                found[f"{chapter} {name}"] = likeness.tokens(functions[name])
            for method in spec["methods"] or []:
                if method in classes.get(name, {}):
                    found[f"{chapter} {name}.{method}"] = likeness.tokens(classes[name][method])
    return found


def functions_of(folder) -> list:
    """(file:qualname, node) of every function and method of every Python file under `folder`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        found += [(f"{path.relative_to(folder)}:{name}", node)
                  for name, node in likeness.every_function(path.read_text())]
    return found


@pytest.fixture(scope="module")
def homes():
    """{chapter: its host engine's folder}, built once per engine version (build/host-engines)."""
    return once_per_run("host-engines", lambda: {c: str(edition.host_engine(p)) for c, p in CHAPTERS.items()})


def test_every_chapter_has_taught_bodies_the_detector_can_compare():
    bodies = {c: taught_bodies(c) for c in CHAPTERS}
    compared = {c: [n for n, t in b.items() if len(t) >= likeness.MIN_TOKENS] for c, b in bodies.items()}
    assert all(compared[c] for c in CHAPTERS if c != "ch01"), compared     # ch01's answers are one-liners
    assert "ch08 kv_bytes_per_token_hf" in compared["ch08"] and "ch04 PagedKVCache.fork" in bodies["ch04"]


@pytest.mark.slow
@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_no_host_engine_holds_a_taught_body_under_any_name(homes, chapter):
    from pathlib import Path
    references = {}
    for later in (c for c in CHAPTERS if c >= chapter):
        references.update(taught_bodies(later))
    engine = Path(homes[chapter]) / "engine"
    functions = functions_of(engine)
    assert len(functions) > 1_000 and any(name.startswith("checks/") for name, _ in functions)
    assert likeness.copies(functions, references) == []


def test_the_detector_finds_a_taught_body_hidden_under_another_name(tmp_path):
    """The control: a host engine file holding ch02's allocate renamed, its locals renamed, in another
    class, beside a method of its own, is found; so is ch08's answer typed into a helper of the checks."""
    from engine.cache.allocator import BlockAllocator
    body = textwrap.dedent(inspect.getsource(BlockAllocator.allocate)).replace("def allocate(", "def hand_out(")
    body = body.replace("blocks", "handed").replace(" n ", " count ").replace("(n)", "(count)")
    (tmp_path / "engine" / "tools").mkdir(parents=True)
    (tmp_path / "engine" / "tools" / "pool.py").write_text(
        "class Pool:\n    def size(self):\n        return len(self.free)\n\n" + textwrap.indent(body, "    "))
    solution = next(c.source for c in expanded(CHAPTERS["ch08"]).cells if cells.grade_id(c) == "ch08_kv_bytes")
    (tmp_path / "engine" / "checks").mkdir()
    (tmp_path / "engine" / "checks" / "ch08.py").write_text(solution.replace("kv_bytes_per_token_hf", "figures_bytes"))
    references = dict(taught_bodies("ch02"), **taught_bodies("ch08"))
    found = {(name, reference) for name, reference, _ in likeness.copies(functions_of(tmp_path / "engine"),
                                                                          references)}
    assert found == {("tools/pool.py:Pool.hand_out", "ch02 BlockAllocator.allocate"),
                     ("checks/ch08.py:figures_bytes", "ch08 kv_bytes_per_token_hf")}, found


def _defined(path, name):
    """The top-level statement of the file at `path` that defines or assigns `name`."""
    return next(n for n in ast.parse(path.read_text()).body if getattr(n, "name", None) == name or (
        isinstance(n, ast.Assign) and any(getattr(t, "id", None) == name for t in n.targets)))


@pytest.mark.slow
@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_the_host_keeps_of_the_checks_only_what_the_chapters_cells_use(homes, chapter):
    """No check runs in the host: each `check_...` there only says where it runs; what the chapter's own
    cells and the host's where_it_lives helpers use imports and runs (a subprocess on the host engine)."""
    from pathlib import Path
    home = Path(homes[chapter])
    checks = home / "engine" / "checks"
    for path in sorted(checks.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("check_"):
                assert JUDGE_ONLY in ast.unparse(node) and len(node.body) == 1, (path.name, node.name)
    uses = sorted(edition.chapter_cell_uses([CHAPTERS[chapter]], edition.repo_root()))
    probe = ("import importlib, json, sys\n"
             "uses = json.loads(sys.argv[1])\n"
             "bad = []\n"
             "for module, name in uses:\n"
             "    value = getattr(importlib.import_module(module), name, None)\n"
             "    text = str(getattr(getattr(value, '__code__', None), 'co_consts', ''))\n"
             f"    if value is None or {JUDGE_ONLY!r} in text:\n"
             "        bad.append((module, name))\n"
             "import engine.checks.compose as compose\n"
             "print(json.dumps({'bad': bad, 'helper': hasattr(compose.together, '__wrapped__')}))\n")
    run = subprocess.run([sys.executable, "-c", probe, json.dumps(uses)], cwd=home, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(home), "MPLBACKEND": "Agg"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout.splitlines()[-1])
    assert said["bad"] == [] and said["helper"], said         # where_it_lives's helpers are kept
    if chapter == "ch08":
        assert ["engine.checks.ch08", "kv_bytes_reference"] in map(list, uses)


def test_chapter_8s_figures_get_their_numbers_from_a_table_that_refuses_any_other_config(tmp_path):
    """Cut on a copy of the checks as the host's is: kv_bytes_reference answers the chapter's published
    configs exactly as the grader's own does and refuses the configs its check adds (a synthetic MLA,
    a null head_dim), and no code that computes the answer (ch08._oracle) is left."""
    import shutil
    from engine.course.paths import repo_root
    checks = tmp_path / "engine" / "checks"
    shutil.copytree(repo_root() / "engine" / "checks", checks, ignore=shutil.ignore_patterns("__pycache__"))
    cut = edition.host_checks(checks, edition.chapter_cell_uses([CHAPTERS["ch08"]], repo_root()))
    assert {"engine.checks.ch08._oracle", "engine.checks.ch08.check_kv_bytes_from_config",
            "engine.checks.ch08.kv_bytes_reference"} <= set(cut)
    assert "_oracle(" not in ast.unparse(_defined(checks / "ch08.py", "kv_bytes_reference"))
    namespace = {}
    stand_in = _defined(checks / "ch08.py", "kv_bytes_reference")
    table = _defined(checks / "ch08.py", "_TABLE_kv_bytes_reference")
    exec(compile(ast.Module([stand_in, table], []), "<host ch08>", "exec"), namespace)
    mine = namespace["kv_bytes_reference"]
    for name in ch08.CONFIG_FILES:
        hf = ch08.load_hf(name)
        assert mine(hf) == ch08.kv_bytes_reference(hf) and mine(hf, 1) == ch08.kv_bytes_reference(hf, 1)
        assert mine(hf, dtype_bytes=2) == ch08.kv_bytes_reference(hf, 2)
    synthetic = {"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 256,
                 "kv_lora_rank": 96, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32}
    for config in (synthetic, {**ch08.load_hf("llama-3-8b"), "head_dim": None}):
        with pytest.raises(LookupError, match="published configs"):
            mine(config, 2)


# Exercise 8.2 written as a learner might, not as the solution is: every config the check tries passes.
KV_BYTES_OWN = """
def kv_bytes_per_token_hf(hf, dtype_bytes=2):
    n_layers = hf["num_hidden_layers"]
    if hf.get("kv_lora_rank"):
        return n_layers * dtype_bytes * (hf["kv_lora_rank"] + hf["qk_rope_head_dim"])
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads", heads) or heads
    dim = hf.get("head_dim") or hf["hidden_size"] // heads
    per_layer = kv_heads * dim * dtype_bytes
    return 2 * n_layers * per_layer
"""


@pytest.mark.slow
def test_chapter_8s_answer_through_the_hosts_modules_earns_nothing_and_own_work_keeps_its_points():
    """The known hole of stop 42: kv_bytes_per_token_hf returning the checks' kv_bytes_reference, reached
    through torch.sys.modules (no text the own-work rule reads), earned Exercise 8.2's 3 points under
    make grade. The host's table answers the published configs only, so the check's synthetic MLA config
    fails it: 0. The solution and a learner's own version keep their 3 points."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.course.grading import sandbox
    from engine.course.grading.grade import grade_notebook, sandboxed_grade
    from fixtures.course_support import BUILD, stubbed, with_solution, write_notebook
    from fixtures.sealed_cases import CHECKS_UNSEEN_CH08
    grader = sandboxed_grade if sandbox.available()[0] else grade_notebook
    path = CHAPTERS["ch08"]
    solution = next(c.source for c in expanded(path).cells if cells.grade_id(c) == "ch08_kv_bytes")
    notebooks = {name: with_solution(stubbed(expanded(path)), "ch08_kv_bytes", source) for name, source in
                 {"cheat": CHECKS_UNSEEN_CH08, "solution": solution, "own": KV_BYTES_OWN}.items()}

    def grade(name):
        result = grader(write_notebook(notebooks[name], BUILD / "host-engine" / name, path.stem), path, 60)
        test = next(e for e in result.exercises if e.grade_id == "ch08_test_kv_bytes")
        return name, (test.earned, test.message)
    with ThreadPoolExecutor(max_workers=2) as pool:
        graded = dict(pool.map(grade, notebooks))
    assert graded["cheat"][0] == 0 and "published configs" in graded["cheat"][1], graded["cheat"]
    assert graded["solution"][0] == graded["own"][0] == 3, graded
