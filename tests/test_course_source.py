"""The chapter loader: jupytext read, `#| include` expansion, nbgrader metadata kept, stable output."""
import json
import textwrap

import nbformat
import pytest

from engine.course.authoring.include import BEGIN, END, IncludeError, expand_cell
from engine.course.authoring.source import load_chapter
from fixtures.course_support import FIXTURE_CHAPTER, REPO, real_chapters

MODULE = textwrap.dedent('''\
    """A module to include from."""
    import functools


    def helper(x):
        """Doubles."""
        # the first comment of the body
        y = x * 2
        return y


    def no_docstring(x):
        return x + 1


    @functools.lru_cache
    def decorated(x):
        return x


    def only_docstring():
        """Nothing else."""


    class Pool:
        """A pool."""

        def __init__(self, n):
            self.n = n

        def take(self):
            """Take one."""
            if self.n == 0:
                raise ValueError("empty")
            self.n -= 1
            return self.n

        def give(self):
            self.n += 1
    ''')


# take() as both include forms show it (indented as in the expected texts below, before their dedent)
TAKE_SOLVED = textwrap.indent(textwrap.dedent(f'''\
    def take(self):
        """Take one."""
        {BEGIN}
        if self.n == 0:
            raise ValueError("empty")
        self.n -= 1
        return self.n
        {END}
    '''), " " * 12)


@pytest.fixture
def root(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(MODULE)
    return tmp_path


def test_class_include_marks_only_the_named_method_bodies_after_their_docstrings(root):
    source = expand_cell("#| include pkg/mod.py::Pool solve=take,give\nPool(2).take()", root)
    assert source == textwrap.dedent(f'''\
        class Pool:
            """A pool."""

            def __init__(self, n):
                self.n = n

{TAKE_SOLVED}
            def give(self):
                {BEGIN}
                self.n += 1
                {END}

        Pool(2).take()''')


def test_function_include_solves_the_whole_body_and_keeps_leading_comments(root):
    source = expand_cell("#| include pkg/mod.py::helper", root)
    assert source.splitlines() == [
        "def helper(x):", '    """Doubles."""', f"    {BEGIN}", "    # the first comment of the body",
        "    y = x * 2", "    return y", f"    {END}"]
    assert expand_cell("#| include pkg/mod.py::no_docstring", root).splitlines()[1] == f"    {BEGIN}"


def test_include_keeps_decorators_and_class_without_solve_is_shown_as_is(root):
    assert expand_cell("#| include pkg/mod.py::decorated", root).startswith("@functools.lru_cache\ndef decorated")
    plain = expand_cell("#| include pkg/mod.py::Pool", root)
    assert BEGIN not in plain and plain.startswith("class Pool:") and plain.endswith("self.n += 1")


def test_selected_methods_become_a_subclass_of_the_engine_class(root):
    source = expand_cell("#| include pkg/mod.py::Pool.give,take solve=take\nPool(2).take()", root)
    assert source == textwrap.dedent(f'''\
        import pkg.mod


        class Pool(pkg.mod.Pool):
            """The engine's Pool, with give and take written here."""

            def give(self):
                self.n += 1

{TAKE_SOLVED}
        Pool(2).take()''')


def test_a_selected_subclass_runs_twice_to_the_same_class(root, monkeypatch):
    monkeypatch.syspath_prepend(str(root))
    source = expand_cell("#| include pkg/mod.py::Pool.take", root)
    namespace: dict = {}
    exec(source, namespace)
    first = namespace["Pool"]
    exec(source, namespace)
    assert namespace["Pool"].__mro__[1] is first.__mro__[1] and namespace["Pool"](1).take() == 0


def test_cells_without_a_directive_are_unchanged(root):
    assert expand_cell("x = 1\n#| include pkg/mod.py::helper", root) == "x = 1\n#| include pkg/mod.py::helper"


@pytest.mark.parametrize("directive, message", [
    ("#| include pkg/nope.py::helper", "pkg/nope.py: no such file"),
    ("#| include pkg/mod.py::missing", "no top-level class or function 'missing' in mod.py; it has: helper"),
    ("#| include pkg/mod.py::Pool solve=take,pour", "no method 'pour' in class Pool; it has: __init__, take, give"),
    ("#| include pkg/mod.py::helper solve=x", "solve= names methods of a class"),
    ("#| include pkg/mod.py::only_docstring", "has only a docstring: nothing to solve"),
    ("#| include pkg/mod.py helper", "malformed include directive"),
    ("#| include pkg/mod.py::Pool.take,pour", "no method 'pour' in class Pool"),
    ("#| include pkg/mod.py::helper.x", "selects methods of a class, and helper is a function"),
    ("#| include pkg/mod.py::Pool.take solve=give", "solve= names give, which the cell does not include"),
])
def test_bad_includes_say_what_is_wrong(root, directive, message):
    with pytest.raises(IncludeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        expand_cell(directive, root)


def test_load_chapter_expands_keeps_nbgrader_metadata_and_drops_jupytext(tmp_path):
    notebook = load_chapter(FIXTURE_CHAPTER)
    by_id = {cell.id: cell for cell in notebook.cells}
    assert "jupytext" not in notebook.metadata
    assert notebook.metadata.kernelspec.name == "python3"
    assert by_id["counter"].source.startswith("class Counter:") and BEGIN in by_id["counter"].source
    assert by_id["counter"].source.endswith("Counter().increment(5)")  # the code after the directive
    assert by_id["test_increment"].metadata.nbgrader == {
        "grade": True, "grade_id": "test_increment", "locked": True, "points": 2, "schema_version": 3,
        "solution": False}
    assert all(set(cell.metadata) <= {"nbgrader"} for cell in notebook.cells)  # no lines_to_next_cell
    nbformat.validate(notebook)


def test_load_chapter_is_deterministic():
    first, second = load_chapter(FIXTURE_CHAPTER), load_chapter(FIXTURE_CHAPTER)
    assert nbformat.writes(first) == nbformat.writes(second)
    assert [cell.id for cell in first.cells][:3] == ["intro", "setup", "counter"]


def test_include_errors_name_the_chapter_and_cell(tmp_path):
    chapter = tmp_path / "ch01_broken.py"
    text = FIXTURE_CHAPTER.read_text().replace("fixture_lib.py::triple", "fixture_lib.py::quadruple")
    chapter.write_text(text)
    with pytest.raises(IncludeError, match=r"ch01_broken.py, cell \d+ \(grade_id triple\): .*'quadruple'"):
        load_chapter(chapter, root=REPO)


@pytest.mark.parametrize("chapter", real_chapters(), ids=lambda p: p.stem)
def test_real_chapters_load_and_serialize(chapter):
    notebook = load_chapter(chapter)
    assert "jupytext" not in json.dumps(notebook.metadata)
    assert all("nbgrader" in cell.metadata for cell in notebook.cells)
