"""One direction (issue 36 item 2): the judge never hands the host a handle to code of its own.

A check used to hand learner objects functions of the judge's (a recorder set as `sched.publish`, a
lambda as a prefix cache's hash_fn), and learner code holding one could call back into the judge
(`self.cache.swap_out._function`, kept and called, earned 29/29 on ch07). Now a recorder is built where
the learner's object lives (engine.checks.recording) and read back as data, and the channel refuses, on
the judge's side, to send a function, method, lambda, closure or class as a handle, naming it.
"""
import functools
import threading

import pytest

from engine.cache.allocator import BlockAllocator
from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.checks import ch03, ch05, ch07, recording
from engine.course.grading.sealed.remote import Remote
from engine.serve.scheduler import Scheduler
from fixtures.channel_pair import served_pair
from fixtures.check_support import hosted, passes

pytestmark = pytest.mark.usefixtures("one_thread")


class Learner:
    """A learner's object in the host: it keeps what the judge hands it and walks attributes from there."""

    def __init__(self):
        self.held = None

    def take(self, value) -> None:
        self.held = value

    def call(self, name: str, *args):
        return getattr(self.held, name)(*args)

    def walk(self, routes: list) -> dict:
        """{route: what it reached ("refused: ..." when a step raised)}; "()" in a route calls the value."""
        found = {}
        for route in routes:
            value = self
            try:
                for step in route:
                    value = value() if step == "()" else getattr(value, step)
            except Exception as error:  # noqa: BLE001 - what the route met is the answer
                found[".".join(route)] = f"refused: {type(error).__name__}: {error}"
                continue
            found[".".join(route)] = describe(value)
        return found


def describe(value) -> str:
    """A value the host reached, in words: "judge's <type>" for a handle to the judge's object."""
    if type(value) is Remote:
        return f"judge's {value._info['type'][1]}"
    return type(value).__name__


@pytest.fixture()
def pair():
    objects = {"learner": Learner()}
    with served_pair(objects) as (judge, host):
        yield judge, objects


def recorder_of(calls):
    def recording_publish(seq):
        calls.append(seq)
    return recording_publish


class Local(PagedKVCache):
    """A class a check might build for itself."""


@pytest.mark.parametrize("value, named", [
    (recorder_of([]), f"closure {__name__}.recorder_of.<locals>.recording_publish"),
    (lambda seq, index: None, f"lambda {__name__}.<lambda>"),
    (BlockAllocator(4).allocate, "method (of a BlockAllocator) engine.cache.allocator.BlockAllocator.allocate"),
    (functools.partial(print, 1), "function builtins.print"),
    (Local, f"class {__name__}.Local"),
    (describe, f"function {__name__}.describe"),
], ids=["closure", "lambda", "bound method", "partial", "class", "function"])
def test_a_check_handing_the_host_code_of_its_own_is_refused_and_the_message_names_it(pair, value, named):
    judge, objects = pair
    learner = judge.request("lookup", None)["learner"]
    with pytest.raises(PermissionError, match="does not hand the notebook's process its own") as refused:
        learner.publish = value                       # set as an attribute of the learner's object
    assert named in str(refused.value)
    with pytest.raises(PermissionError, match="does not hand the notebook's process its own"):
        learner.take(value)                           # or passed to its method
    with pytest.raises(PermissionError, match="does not hand the notebook's process its own"):
        learner.take([1, {"hook": value}])            # or inside data
    assert objects["learner"].held is None and "publish" not in vars(objects["learner"])


def test_the_engines_classes_and_functions_still_go_by_name_as_the_hosts_own_copy(pair):
    judge, objects = pair
    learner = judge.request("lookup", None)["learner"]
    assert judge.encode(PagedKVCache) == {"~": "class", "c": ("engine.cache.paged", "PagedKVCache")}
    learner.take(PagedKVCache)
    assert objects["learner"].held is PagedKVCache    # one process here: the host's copy is this one
    learner.take(BlockAllocator(4))                   # an engine object of the judge's: still a handle, for now
    assert type(objects["learner"].held) is Remote


def test_learner_code_walking_from_a_judges_object_reaches_no_code_of_the_judge(pair):
    """The routes learner code took (the function behind a method, a closure set on an object) end in a
    refusal or in data; a method still works, as the object and its name."""
    judge, objects = pair
    learner = judge.request("lookup", None)["learner"]
    allocator = BlockAllocator(4)
    allocator.hook = recorder_of([])                  # a closure of the judge's on an object it hands out
    learner.take(allocator)
    routes = [("held", "allocate", "__func__"), ("held", "allocate", "_function"), ("held", "allocate", "__self__"),
              ("held", "allocate", "_bound", "()"), ("held", "hook"), ("held", "hook", "__closure__"),
              ("held", "release", "__wrapped__"), ("held", "allocate", "__call__")]
    found = learner.walk(routes)
    assert not [r for r, what in found.items() if what.startswith("judge's")], found
    assert "does not hand the notebook's process its own closure" in found["held.hook"]
    assert "BlockAllocator.allocate" in found["held.allocate._bound.()"]
    assert learner.walk([("held", "allocate")]) == {"held.allocate": "_RemoteMethod"}
    learner.call("allocate", 1)                      # called by name, in the judge
    assert allocator.num_free == 3


# ---- the checks' recorders run where the learner's objects live, and come back as data ----------------------

@pytest.fixture()
def where_records_are_made(monkeypatch):
    """The threads that made a Record: in `hosted`, the host is a thread of its own."""
    made = []
    init = recording.Record.__init__

    def noting(self):
        made.append(threading.current_thread())
        init(self)
    monkeypatch.setattr(recording.Record, "__init__", noting)
    return made


def test_ch07s_recorders_run_in_the_host_and_its_checks_pass_there(where_records_are_made):
    with hosted(sched=Scheduler, cache=PagedKVCache) as remote:
        passes(ch07.check_preempt, remote["sched"])
        passes(ch07.check_reserve_or_preempt, remote["sched"])
        passes(ch07.check_serving_under_pressure, remote["sched"], remote["cache"])
    assert where_records_are_made and threading.main_thread() not in where_records_are_made


def test_ch03s_copy_on_write_recorder_runs_in_the_host(where_records_are_made):
    with hosted(cache=PagedKVCache) as remote:
        passes(ch03.check_reserve, remote["cache"])
    assert where_records_are_made and threading.main_thread() not in where_records_are_made


def test_ch05s_colliding_hash_is_the_hosts_own_function():
    with hosted(keys=PrefixCache) as remote:
        made = recording.constant_hash(remote["keys"], 7)
        assert type(made) is Remote and made._info["owner"] == "L"     # the host's, handed to the judge
        for check in (ch05.check_chain, ch05.check_matches, ch05.check_remember):
            passes(check, remote["keys"])


def test_a_record_that_is_not_plain_data_fails_the_check_that_reads_it():
    record = recording.Record()
    record.calls.append((1, True))
    assert recording.calls(record, "publish's calls") == [(1, True)]
    record.calls.append((object(), True))
    with pytest.raises(ch07.CheckFailed, match="the record of publish's calls .* is not plain data"):
        recording.calls(record, "publish's calls")


# ---- through the real grader ------------------------------------------------------------------------------

PROBE = '''

def _reached_the_grader(value):
    """What of the grader's code `value` is a handle to, or None."""
    if type(value).__name__ != "Remote":
        return None
    info = value._info
    kind = (info.get("type") or ["", ""])[1]
    if info.get("owner") == "T" and (info.get("is_class") or kind in (
            "function", "method", "builtin_function_or_method", "method-wrapper", "partial", "type")):
        return f"{kind} {info.get('name')}"
    return None


GRADER_ROUTES = [("publish",), ("preempt",), ("reserve_or_preempt",), ("publish", "_bound", "()"),
                 ("cache", "swap_out"), ("cache", "swap_out", "_function"), ("cache", "swap_out", "__func__"),
                 ("cache", "swap_out", "_bound", "()"), ("cache", "swap_in", "_bound", "()"),
                 ("cache", "allocator", "allocate", "_bound", "()"), ("prefix", "publish", "_bound", "()"),
                 ("prefix", "hash_fn"), ("prefix", "cache", "swap_out", "_bound", "()")]


def _probe_the_grader(sched):
    """Every route to the grader's code that learner code took: what it reaches costs this exercise."""
    for route in GRADER_ROUTES:
        value = sched
        try:
            for step in route:
                value = value() if step == "()" else getattr(value, step)
        except Exception:
            continue
        reached = _reached_the_grader(value)
        if reached:
            raise RuntimeError(f"self.{'.'.join(route)} reached the grader's {reached}")
'''


@pytest.mark.slow
def test_a_preempt_that_reaches_for_the_graders_functions_gets_none_and_keeps_full_marks():
    """ch07's solution, its preempt probing every route to the judge's code that learner code took (the
    recorders set on its scheduler and cache, the function behind a method of the judge's cache, allocator
    or prefix cache) and failing if one reaches a function of the judge's: under make grade's sealed grader
    it reaches none, and every exercise keeps its points. (On the code before, where `self.publish` and
    `self.preempt` were functions of the judge's and `_bound()` gave a handle to the judge's bound method,
    this notebook lost preempt, reserve_or_preempt, parallel sampling and serving: 16 of 29 points.)"""
    from fixtures.course_support import BUILD, REPO, expanded, grade_json, possible, scores, with_cell_edited, \
        write_notebook
    chapter = REPO / "solutions" / "ch07_continuous_batching.py"
    notebook = with_cell_edited(expanded(chapter), "ch07_preempt", lambda source: source.replace(
        "    def preempt(self, seq: Sequence) -> str:\n",
        "    def preempt(self, seq: Sequence) -> str:\n        _probe_the_grader(self)\n").replace(
        "\nPreemption = Scheduler", PROBE + "\nPreemption = Scheduler"))
    notebook = with_cell_edited(notebook, "ch07_preempt", lambda source: source.replace(
        "        while True:\n", "        _probe_the_grader(self)\n        while True:\n", 1))
    folder = BUILD / "styles" / "ch07-one-way"
    write_notebook(notebook, folder, chapter.stem)
    report = grade_json(folder, REPO / "solutions")
    full = possible(report)
    assert {key: scores(report)[key] for key in full} == full
