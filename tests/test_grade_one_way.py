"""One direction, data only (issue 36 item 2): the judge asks, the host answers, and nothing of the judge's
ever reaches the host.

A check used to hand learner objects the judge's own objects (its PagedKVCache, allocator, prefix cache,
sequences) and functions (a recorder set as `sched.publish`), and learner code holding one called back
into the judge (`self.cache.swap_out._function`, kept and called, earned 29/29 on ch07). Now the judge's
channel refuses to encode anything but data (`JudgeObjectRefused`, naming it), the checks build what
learner code holds where the learner's objects live (engine.checks.where_it_lives, made_beside), and a
request from the host is never served: it breaks the channel (`OutOfTurn`), costing that test only.
"""
import functools
import threading

import pytest
import torch

from engine.cache.allocator import BlockAllocator
from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.checks import ch03, ch05, ch07, made_beside, recording, tiny
from engine.course.grading.sealed.remote import JudgeObjectRefused, OutOfTurn, Remote
from engine.sampling import SamplingParams
from engine.serve.request import Status
from engine.serve.scheduler import Scheduler
from fixtures.channel_pair import served_pair
from fixtures.check_support import hosted, passes

pytestmark = pytest.mark.usefixtures("one_thread")


class Learner:
    """A learner's object in the host: it keeps what the judge hands it and may try to call the judge."""

    def __init__(self):
        self.held = None

    def take(self, value) -> None:
        self.held = value

    def ask_the_judge(self, op: str, *args):
        """What learner code owning the host can do: send the judge a request of its own."""
        return self.channel.request(op, None, *args)


@pytest.fixture()
def pair():
    objects = {"learner": Learner()}
    with served_pair(objects) as (judge, host):
        yield judge, host, objects


def recorder_of(calls):
    def recording_publish(seq):
        calls.append(seq)
    return recording_publish


class Local(PagedKVCache):
    """A class a check might build for itself."""


JUDGE_OBJECTS = {
    "closure": (recorder_of([]), f"{__name__}.recorder_of.<locals>.recording_publish"),
    "lambda": (lambda seq, index: None, f"{__name__}.<lambda>"),
    "bound method": (BlockAllocator(4).allocate, "engine.cache.allocator.BlockAllocator.allocate"),
    "partial": (functools.partial(print, 1), "builtins.print"),
    "own class": (Local, f"{__name__}.Local"),
    "engine object": (BlockAllocator(4), "engine.cache.allocator.BlockAllocator"),
    "engine cache": (PagedKVCache(tiny().config, 4, block_size=4), "engine.cache.paged.PagedKVCache"),
    "module": (torch, "torch"),
    "model": (tiny(), "Qwen3Model"),
    "plain object": (object(), "builtins.object"),
}


@pytest.mark.parametrize("value, named", JUDGE_OBJECTS.values(), ids=list(JUDGE_OBJECTS))
def test_the_judge_sends_data_only_and_the_refusal_names_what_it_refused(pair, value, named):
    judge, _, objects = pair
    learner = judge.request("lookup", None)["learner"]
    with pytest.raises(JudgeObjectRefused, match="does not hand the notebook's process its own") as refused:
        learner.publish = value                       # set as an attribute of the learner's object
    assert named in str(refused.value)
    with pytest.raises(JudgeObjectRefused):
        learner.take(value)                           # or passed to its method
    with pytest.raises(JudgeObjectRefused):
        learner.take([1, {"hook": value}])            # or inside data
    assert objects["learner"].held is None and "publish" not in vars(objects["learner"])


def test_data_and_the_engines_names_cross(pair):
    judge, _, objects = pair
    learner = judge.request("lookup", None)["learner"]
    assert judge.encode(PagedKVCache) == {"~": "class", "c": ("engine.cache.paged", "PagedKVCache")}
    sent = [1, 2.5, "x", None, (1, [2]), {"k": {3}}, torch.arange(3), torch.float16, SamplingParams(max_tokens=3),
            Status.RUNNING, b"raw", range(3), PagedKVCache]
    for value in sent:
        learner.take(value)
        held = objects["learner"].held
        assert held is value if value is PagedKVCache else (
            torch.equal(held, value) if isinstance(value, torch.Tensor) else held == value), value


@pytest.mark.parametrize("op, args", [("lookup", ()), ("call_engine", ("builtins", "print", "hi")),
                                      ("getattr", ("x",)), ("cell", ("import os", "learner", "c1", None)),
                                      ("call", ()), ("callmethod", ("take", 1))],
                         ids=["lookup", "call_engine", "getattr", "cell", "call", "callmethod"])
def test_a_request_from_the_host_breaks_the_channel_runs_nothing_and_costs_that_test(pair, op, args):
    """Learner code owning the host sends the judge a request while the judge waits for an answer: the
    judge serves none (whatever it names), the call in flight fails with OutOfTurn, and the channel stays
    broken until both processes start again (the grader restarts them for the next test)."""
    judge, host, objects = pair
    learner = judge.request("lookup", None)["learner"]
    objects["learner"].channel = host                 # the host's own end, as learner code owning it has
    served = []
    judge.serve = lambda *request: served.append(request)
    with pytest.raises(OutOfTurn, match="the grader answers none"):
        learner.ask_the_judge(op, *args)
    assert served == []
    with pytest.raises(OutOfTurn):
        learner.take(1)


def test_every_engine_object_a_check_gives_learner_code_is_built_in_the_host():
    """The checks' helpers build caches, prefix caches, entries, sequences and schedulers in the process
    the learner's class lives in: the judge holds Remotes of the host's, never the reverse."""
    with hosted(cache=PagedKVCache, keys=PrefixCache, sched=Scheduler) as remote:
        cache = made_beside(remote["keys"], PagedKVCache, tiny().config, 8, block_size=4)
        prefix = made_beside(remote["keys"], PrefixCache, cache)
        for made in (cache, prefix, prefix.cache, ch07._sequence(remote["sched"], 0, [1, 2, 3]),
                     ch07._scheduler(remote["sched"], num_blocks=8, prefix=True)):
            assert type(made) is Remote and made._info["owner"] == "L", made
        for check in (ch05.check_matches, ch05.check_attach):
            passes(check, remote["keys"])


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
    """What of the grader's `value` is a handle to, or None: in the host, any Remote is the grader's."""
    if type(value).__name__ != "Remote" and type(value).__name__ != "_RemoteMethod":
        return None
    return f"{type(value).__name__} {getattr(value, '_info', {}).get('type')}"


GRADER_ROUTES = [(), ("cache",), ("cache", "allocator"), ("prefix",), ("prefix", "cache"), ("running",),
                 ("waiting",), ("config",), ("cache", "tables"),
                 ("publish",), ("preempt",), ("reserve_or_preempt",), ("publish", "_bound", "()"),
                 ("cache", "swap_out"), ("cache", "swap_out", "_function"), ("cache", "swap_out", "__func__"),
                 ("cache", "swap_out", "_bound", "()"), ("cache", "swap_in", "_bound", "()"),
                 ("cache", "allocator", "allocate", "_bound", "()"), ("prefix", "publish", "_bound", "()"),
                 ("prefix", "hash_fn"), ("prefix", "cache", "swap_out", "_bound", "()")]


def _probe_the_grader(sched):
    """Every route to the grader that learner code took: what it reaches costs this exercise."""
    for seq in list(sched.running) + list(sched.waiting):
        for name in ("request", "tokens", "generator"):
            if _reached_the_grader(getattr(seq, name, None)):
                raise RuntimeError(f"seq.{name} reached the grader")
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
