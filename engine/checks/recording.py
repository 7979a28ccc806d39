"""Calls of the learner's objects, recorded where those objects live: the checks read the record as data.

A check that wants to know how the learner's code calls one of its own methods (did preempt publish
before releasing? which sequences did reserve_or_preempt preempt?) wraps that method with a recorder.
In the grader the learner's objects live in the host (the notebook's process), and a recorder the judge
built there would be a function of the judge's that learner code holds and calls: a door back into the
judge. So each recorder here is a `where_it_lives` helper: it runs where the object lives, on that
process's own copy of the engine, wraps the method there, and returns a `Record`, whose `data()` the
check reads afterwards as plain data (numbers, strings, booleans, tuples and lists of them; `calls`
refuses anything else).

What a record says is the host's word: learner code can change it. That is fine here: a record only
concerns the notebook it was made for (it can take that notebook's points away or, at most, skip a
hint or a part of a check that its own code decides anyway: the learner's code already chose whether to
call the wrapped method at all), and nothing in it is run or believed beyond those values.
"""
from __future__ import annotations

from engine.checks import CheckFailed, where_it_lives

_PLAIN = (type(None), bool, int, float, str)


class Record:
    """What a recorder noted, one entry per call, in the process of the object it watches."""

    def __init__(self):
        self.calls: list = []

    def data(self) -> list:
        """The entries, as data (a copy)."""
        return list(self.calls)


def _plain(value, depth: int = 0) -> bool:
    if type(value) in _PLAIN:
        return True
    if type(value) in (tuple, list) and depth < 4:
        return all(_plain(v, depth + 1) for v in value)
    return False


def calls(record, what: str) -> list:
    """The entries of `record` (a Record here or in the host) as plain data; a CheckFailed naming `what`
    when the record holds anything else (the host's own record, changed)."""
    entries = record.data()
    if type(entries) is not list or not all(_plain(entry) for entry in entries):
        raise CheckFailed(f"the record of {what} kept in your notebook's process is not plain data (numbers, "
                          f"strings, tuples): something in the notebook changed it")
    return [tuple(entry) if type(entry) is list else entry for entry in entries]


def _word(value):
    """A value the learner's method returned, as the record keeps it: itself when it is a string or None
    (what an honest method returns), else its repr."""
    return value if value is None or type(value) is str else repr(value)


@where_it_lives
def record_publish(sched) -> Record:
    """Make sched.publish note (the victim's num_computed, whether it still had its table) at each call,
    then publish as before."""
    record, publish = Record(), sched.publish

    def recording_publish(seq):
        record.calls.append((seq.num_computed, bool(seq.seq_id in sched.cache.tables)))
        return publish(seq)
    sched.publish = recording_publish
    return record


@where_it_lives
def record_copy_on_write(cache) -> Record:
    """Make cache.copy_on_write only note (seq, index) at each call, copying nothing."""
    record = Record()

    def recording_copy_on_write(seq, index):
        record.calls.append((seq, index))
    cache.copy_on_write = recording_copy_on_write
    return record


@where_it_lives
def record_swap_out(cache) -> Record:
    """Make cache.swap_out note the sequence id it swaps out, then swap as before."""
    record, swap_out = Record(), cache.swap_out

    def recording_swap_out(seq):
        record.calls.append(seq if type(seq) is int else repr(seq))
        return swap_out(seq)
    cache.swap_out = recording_swap_out
    return record


@where_it_lives
def record_preemption(sched) -> Record:
    """Make sched.preempt note ("preempt", victim id, the mode it returned) and sched.reserve_or_preempt
    note ("victims", asker id, ids it could preempt (oldest first), ids preempted) when it preempted."""
    record, preempt, reserve_or_preempt = Record(), sched.preempt, sched.reserve_or_preempt

    def recording_preempt(seq):
        mode = preempt(seq)
        record.calls.append(("preempt", seq.seq_id, _word(mode)))
        return mode

    def recording_reserve_or_preempt(seq, count, scheduled):
        eligible = [s.seq_id for s in sched.running if s.seq_id not in scheduled]
        before = len(record.calls)
        reserved = reserve_or_preempt(seq, count, scheduled)
        victims = [entry[1] for entry in record.calls[before:] if entry[0] == "preempt"]
        if victims:
            record.calls.append(("victims", seq.seq_id, eligible, victims))
        return reserved
    sched.preempt, sched.reserve_or_preempt = recording_preempt, recording_reserve_or_preempt
    return record


@where_it_lives
def constant_hash(anchor, value: int):
    """A hash function (parent, tokens, extra) -> `value`, made where `anchor` (the learner's class) lives,
    so the learner's cache is handed its own process's function, never one of the grader's."""
    def hash_fn(parent, tokens, extra):
        return value
    return hash_fn
