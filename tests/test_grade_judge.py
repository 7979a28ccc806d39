"""The judge and the host (engine.course.grading.sealed): tests run where learner code cannot reach.

The channel between them carries data only, one way (tests/test_grade_one_way.py); an object of the host
compares equal only by its contents; a tensor or generator crosses as a copy (a list an attribute holds
stays the owner's); and the host imports an engine without this chapter's reference.
"""
import socket
import subprocess
import sys

import pytest
import torch

from engine.course.grading.reading.names import needed_cells
from engine.course.grading.sandbox import cuda_driver
from engine.course.grading.sealed.remote import Channel, Remote
from fixtures.channel_pair import served_pair


class Cache:
    """A stand-in for a learner's object in the host."""

    def __init__(self):
        self.pools = [torch.zeros(4), torch.zeros(2)]
        self.running = []

    def write(self, out: torch.Tensor) -> None:
        out.view(-1).numpy()[:] = 3.0        # through the pointer, as a kernel writes: no version bump

    def draw(self, generator: torch.Generator) -> int:
        return int(torch.randint(0, 1000, (1,), generator=generator))

    def __eq__(self, other):                 # says yes to everything
        return True


@pytest.fixture()
def pair():
    objects = {"cache": Cache(), "answer": [1, 2, (3, "x")]}
    with served_pair(objects) as (judge, host):
        yield judge, host, objects


def test_data_crosses_as_data_and_objects_as_remotes(pair):
    judge, _, objects = pair
    found = judge.request("lookup", None)
    assert found["answer"] == [1, 2, (3, "x")] and type(found["answer"]) is list
    assert type(found["cache"]) is Remote


def test_a_remote_never_asks_the_other_sides_eq(pair):
    judge, _, _ = pair
    cache = judge.request("lookup", None)["cache"]
    assert cache == cache
    assert not (cache == 5) and cache != [1]     # the learner's __eq__ says yes; the judge does not ask it


def test_lists_an_attribute_holds_are_live_and_tensors_are_copies(pair):
    judge, _, objects = pair
    cache = judge.request("lookup", None)["cache"]
    cache.running.append(7)
    assert objects["cache"].running == [7] and cache.running == [7]
    for pool in list(cache.pools):
        pool.fill_(5.0)                            # the judge's copy: the host's pools are as they were
    len(cache.pools)
    assert [p.tolist() for p in objects["cache"].pools] == [[0.0] * 4, [0.0] * 2]


def test_what_a_call_writes_into_a_tensor_or_draws_from_a_generator_stays_on_its_side(pair):
    """A tensor or generator sent in a call is the host's copy: what the call does to it never comes back
    (a check that needs it asks for it as the call's answer: engine.checks.where_it_lives)."""
    judge, _, _ = pair
    cache = judge.request("lookup", None)["cache"]
    out = torch.zeros(2, 3)
    cache.write(out[1])
    assert out.tolist() == [[0.0] * 3] * 2
    mine, twin = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    first = int(torch.randint(0, 1000, (1,), generator=twin))
    assert cache.draw(mine) == first and cache.draw(mine) == first     # the same state sent twice
    assert torch.equal(mine.get_state(), torch.Generator().manual_seed(3).get_state())


def test_the_judge_runs_the_setup_cells_its_tests_read():
    cells = [("trusted", "imports", "from engine.checks import ch02\nimport torch"),
             ("trusted", "demo", "plot = 1"),
             ("trusted", "model", "model = torch.zeros(1)"),
             ("learner", "answer", "def f(): return 1"),
             ("test", "t1", "ch02.check_x(f, model)")]
    assert needed_cells(cells) == {"imports", "model"}


def test_the_hosts_engine_has_no_reference_of_the_chapter(tmp_path):
    import subprocess
    import sys

    from engine.course.authoring.edition import host_engine
    from engine.course.paths import repo_root
    home = host_engine(repo_root() / "solutions" / "ch02_block_tables.py")
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import engine, engine.cache.slots as s, "
             "engine.config as c; print(engine.__file__); print(c.__file__)\n"
             "try:\n    s.physical_slot([1], 0, 4)\nexcept NotImplementedError as e:\n    print('stub:', e)")
    out = subprocess.run([sys.executable, "-I", "-c", probe, str(home)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120).stdout
    assert str(home) in out.splitlines()[0] and "stub: physical_slot is yours to write in ch02" in out, out


def test_an_exception_named_by_the_host_cannot_stop_the_judge(pair):
    import engine.cache.errors  # noqa: F401 - the judge's checks import it: a class it knows
    judge, _, _ = pair
    for name in (("builtins", "SystemExit"), ("builtins", "KeyboardInterrupt"),
                 ("engine.course.grading.sealed.remote", "RemoteGone")):
        error = judge.decode({"~": "error", "c": list(name), "args": [], "message": "stop",
                              "mro": [list(name), ["builtins", "BaseException"]]})
        assert type(error).__name__ == "RemoteError" and str(error) == "stop"
    error = judge.decode({"~": "error", "c": ["engine.cache.errors", "OutOfBlocks"], "args": [],
                          "attrs": {"wanted": 3, "free": 2}, "message": "out",
                          "mro": [["engine.cache.errors", "OutOfBlocks"], ["builtins", "Exception"]]})
    assert type(error).__name__ == "OutOfBlocks" and (error.wanted, error.free) == (3, 2)


def test_a_method_called_in_a_loop_costs_one_request_per_call(pair):
    judge, host, objects = pair
    cache = judge.request("lookup", None)["cache"]
    asked = []
    ask = judge._request
    judge._request = lambda op, *rest: (asked.append(op), ask(op, *rest))[1]
    for _ in range(3):
        cache.draw(torch.Generator().manual_seed(1))
    assert asked == ["getattr", "callmethod", "callmethod", "callmethod"]     # was: getattr and call, each time
    cache.draw = 5                                 # set on the object: it hides the class's from now on
    assert cache.draw == 5 and objects["cache"].draw == 5


def test_a_method_sent_back_is_the_owners_own(pair):
    judge, _, objects = pair
    cache = judge.request("lookup", None)["cache"]
    objects["cache"].take = lambda method: method(torch.Generator().manual_seed(1))
    assert cache.take(cache.draw) == objects["cache"].draw(torch.Generator().manual_seed(1))


def test_an_edition_error_the_host_names_is_not_written_yet_only_when_the_text_says_so():
    """The host may raise (or describe) the student edition's NotWrittenYet for any name: the judge asks
    the learner's cells, never the exception's class."""
    from engine.course.grading.reading.decide import unwritten
    judge_end, host_end = socket.socketpair()
    judge = Channel(judge_end, "T")
    cells = ["class Mine(PrefixCache):\n    def attach(self, seq, prompt):\n        return 0\n"]
    judge.unwritten = unwritten({"PrefixCache.attach", "PrefixCache.evict"}, cells)

    def raised(qualname: str):
        return judge.decode(judge.encode(RuntimeError("x")) | {"c": ["engine._edition", "NotWrittenYet"],
                            "mro": [["engine._edition", "NotWrittenYet"], ["builtins", "NotImplementedError"]],
                            "attrs": {"qualname": qualname}})
    try:
        assert raised("PrefixCache.evict")._course_edition is True        # no cell defines evict
        forged = raised("PrefixCache.attach")                               # the learner's own attach
        assert isinstance(forged, NotImplementedError) and forged._course_edition is False
        assert raised("PagedKVCache.write")._course_edition is False        # not this chapter's to skip
    finally:
        judge_end.close()
        host_end.close()



def test_not_written_yet_is_read_from_the_learners_text():
    from engine.course.grading.reading.decide import defined_in_text, unwritten
    cells = ["class MyCache(PagedKVCache):\n    def swap_out(self, seq):\n        return 0\n"
             "    def swap_in(self, seq):\n        \"\"\"Bring it back.\"\"\"\n        raise NotImplementedError()\n",
             "def admit(x): pass\n"]
    assert defined_in_text("PagedKVCache.swap_out", cells) and defined_in_text("admit", cells)
    assert not defined_in_text("PagedKVCache.swap_in", cells) and not defined_in_text("swap_out", cells[1:])
    assert defined_in_text("f", ["def f():\n    raise NotWrittenYet('f', 'f')\n"])   # raising something else
    is_unwritten = unwritten({"PagedKVCache.swap_out", "PagedKVCache.swap_in"}, cells)
    assert is_unwritten("PagedKVCache.swap_in") and not is_unwritten("PagedKVCache.swap_out")
    assert not is_unwritten("Scheduler.admit")          # not taught in this chapter: never skipped


def test_a_method_reference_for_an_object_never_handed_out_is_refused(pair):
    judge, _, _ = pair
    with pytest.raises(ValueError):
        judge.decode({"~": "method", "owner": "L", "id": 12345, "name": "draw"})
    with pytest.raises(ValueError):                  # a method of the judge's own object, named by the host
        judge.decode({"~": "method", "owner": "T", "id": 12345, "name": "draw"})


def test_each_notebook_gets_a_fresh_fork_of_the_warm_judge(tmp_path):
    """Two notebooks graded one after the other: each by its own fork of the warm process, which ends
    with its notebook; the second does not see what the first defined."""
    from engine.course.grading.kernel import SealedKernel
    from engine.course.grading.sealed import warm
    plan = {"preimport": ["engine"], "graded": {}, "graded_by_cell": {}, "judge_cells": [], "references": []}
    seen = []
    for number in range(2):
        with SealedKernel(plan, cwd=tmp_path) as kernel:
            assert isinstance(kernel.process, warm.Forked), "the judge was not forked from the warm process"
            run = kernel.run_cell("print(x)" if number else "x = 41 + 1\nprint(x)", "learner", "a", 60)
            assert (run.status, run.outputs[-1].get("ename") if number else run.outputs[0]["text"]) == (
                ("error", "NameError") if number else ("ok", "42\n"))
            seen.append(kernel.process)
        assert kernel.process is None and seen[-1].poll() is not None
    assert seen[0].pid != seen[1].pid


def test_every_binder_of_a_cell_counts_as_a_name_it_binds():
    """A chapter cell's `for b, w, e in ...` binds b, w and e (honest ch02 was flagged 'put back: b')."""
    from engine.course.grading.reading.names import names_bound
    source = ("for b, w, e in rows:\n    y = 1\nwith open(f) as fh:\n    pass\ntry:\n    pass\nexcept E as err:\n"
              "    pass\nif (n := 3):\n    import a.b as c, d.e\ndef f(q=(z := 1)):\n    inner = 2\nclass K:\n"
              "    attr = 1\n[i for i in r]\nq[0] = 1\nobj.attr = 2\n")
    assert names_bound(source) == {"b", "w", "e", "y", "fh", "err", "n", "c", "d", "f", "z", "K"}


def test_a_scratch_cell_is_named_as_the_learner_sees_it():
    import nbformat

    from engine.course.grading.grade import cell_names
    notebook = [nbformat.v4.new_markdown_cell("## 3.2 Reserve room\ntext"), nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("\nprint(dir(engine))  # look around"),
                nbformat.v4.new_markdown_cell("plain")]
    names = cell_names(notebook)
    assert names[id(notebook[2])] == "the 2nd code cell under '3.2 Reserve room' (print(dir(engine))  # look around)"


def test_the_judge_holds_no_more_memory_than_its_bound():
    # A host answering value after value (a generator of 40 MiB strings the check lists) meets this bound
    # in the judge: a MemoryError in that test, not a judge that fills the machine.
    code = ("from engine.course.grading.sealed import judge\njudge.bound_memory()\n"
            "try:\n    hog = bytearray((judge.MEMORY_MB + 512) << 20)\nexcept MemoryError:\n    print('refused')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == ("refused" if not cuda_driver() else ""), out.stderr
