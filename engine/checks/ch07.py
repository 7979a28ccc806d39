"""Chapter 7's checks: admission reserves first, preemption takes the newest and frees what it takes,
swap restores every block where it was, forks share the prompt, and the whole engine stays exact.

The scheduler checks take the learner's `Scheduler` class (the engine's, with the chapter's methods
written by the learner); the swap check takes the learner's `PagedKVCache` class. The last check runs
both inside the real engine under memory pressure and compares every logit with a from-scratch run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import itertools

import torch

from engine.cache.paged import PagedKVCache
from engine.cache.protocol import PagedCache, implements
from engine.cache.prefix import PrefixCache
from engine.checks import (ATOL, CheckFailed, Proved, ceil_div, check, compare_logits, continuations, expect_equal,
                           expect_raises, fail, made_beside, passed, review_choice, review_number, served, shows_text,
                           tiny, where_it_lives)
from engine.checks.compose import naming_earlier_pieces, one_class, written_later
from engine.checks.recording import calls as recorded
from engine.checks.recording import record_preemption, record_publish, record_swap_out
from engine.generate import cached_step, generate, scratch_logits
from engine.sampling import SamplingParams
from engine.seeded import seeded_tokens
from engine.serve.engine import Engine
from engine.serve.request import Request, Sequence, Status, make_generator
from engine.serve.scheduler import SchedulerConfig

NO_RESERVE = ("admission without reserving: admit must call cache.reserve(seq.seq_id, count) for the "
              "chunk it returns, before any compute, or the forward has no blocks to write into "
              "(out of blocks mid-step)")
NO_ROOM_CHECK = ("admission without reserving room: before letting a sequence in, compare the free "
                 "blocks (after make_room) with blocks_wanted for its whole remaining prompt plus "
                 "margin(); otherwise the running sequences run out of blocks mid-step")
LEAKED = ("a preempted sequence's blocks were never freed: preempt must give them back "
          "(self.release(seq), or self.release(seq, swap=True) for a swap)")
NOT_RESET = ("a recomputed sequence was not reset to re-prefill its generated tokens: after a "
             "recompute preemption set num_computed = 0 and keep its tokens (prompt + output) as "
             "they are, so admission prefills all of them again")
OLDEST = ("the oldest request was preempted instead of the newest: walk self.running from the end "
          "(the newest admitted) and take the first id not in `scheduled`")
BY_ID = ("the victim was chosen by the largest seq_id, not by admission order: a sequence admitted "
         "again after a preemption (or swapped back in) is appended to self.running and is the newest "
         "whatever its id. Walk self.running from the end")
WRONG_ORDER = ("swap-in restored the blocks in the wrong order: the i-th saved block must land in "
               "the i-th newly allocated block, and the table must list them in that same order")


def _status(seq) -> str:
    """A sequence's status as its plain name ("running", ...), whatever the learner stored."""
    return getattr(seq.status, "value", seq.status)


@where_it_lives
def _sequence(sched, seq_id: int, tokens: list[int], max_tokens: int = 8, n: int = 1, seed: int = 0):
    """A Sequence of a fresh one-sample request whose prompt is `tokens`, made where `sched` lives."""
    request = Request(seq_id, list(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True), seed, n)
    seq = Sequence(seq_id, request, list(tokens), make_generator(seed))
    request.sequences.append(seq)
    return seq


@where_it_lives
def _scheduler(cls, num_blocks: int, block_size: int = 4, prefix: bool = False, cache_cls=PagedKVCache, **config):
    """The learner's scheduler over a fresh PagedKVCache (or `cache_cls`) of the tiny model (and a prefix
    cache), made where cls lives: in the grader, the learner's process builds all of it from its own engine."""
    cache = cache_cls(tiny().config, num_blocks, block_size=block_size)
    return _scheduler_over(cls, cache, {"margin_blocks": 2, "watermark": 0.0, **config}, prefix)


def _run_prefill(sched, seq) -> None:
    """Put `seq` in the cache with all its tokens computed, and mark it running (oldest first)."""
    sched.cache.create(seq.seq_id)
    cached_step(tiny(), sched.cache, [seq.seq_id], [seq.tokens])
    seq.num_computed, seq.status = len(seq.tokens), Status.RUNNING
    sched.running.append(seq)


def _snapshot(sched) -> dict:
    cache = sched.cache
    return {"free blocks": cache.allocator.num_free, "tables": {s: list(t) for s, t in cache.tables.items()},
            "running": [s.seq_id for s in sched.running], "waiting": [s.seq_id for s in sched.waiting]}


# ---- exercise 7.1: admission ------------------------------------------------------------------

def _admit_first_chunk(cls, proved: Proved) -> None:
    """On an empty pool: the chunk returned, its room reserved, the sequence running."""
    for bs, prompt_len, budget in ((4, 10, 6), (4, 10, 64), (8, 17, 9), (2, 5, 5)):
        sched = _scheduler(cls, num_blocks=16, block_size=bs)
        seq = _sequence(sched, 1, seeded_tokens(prompt_len, seed=prompt_len))
        sched.add(seq)
        want = min(prompt_len, budget)
        got = sched.admit(seq, budget)
        what = f"an empty pool of 16 blocks of {bs}, a {prompt_len}-token prompt, budget {budget}"
        expect_equal(got, want, f"{what}: admit returned",
                     "return the tokens of this step's chunk: min(seq.num_pending, budget)")
        if seq.seq_id not in sched.cache.tables:
            fail(f"{what}: after admit returned {got}, the cache has no table for the sequence",
                 hint="create it in the cache first: self.attach(seq) does, reusing cached prefix blocks")
        room = len(sched.cache.tables[seq.seq_id]) * bs
        if room < want:
            fail(f"{what}: after admit returned {got}, positions with reserved room", f">= {want}", room,
                 NO_RESERVE)
        expect_equal((_status(seq), seq.num_computed, [s.seq_id for s in sched.running]),
                     (Status.RUNNING.value, 0, [1]), f"{what}: (status, num_computed, running ids) after admit",
                     "an admitted sequence is RUNNING, appended to self.running, with num_computed set to "
                     "the tokens attach reused (0 here)")
    proved.note("the first chunk returned and its room reserved before any compute")


def _crowded_admit(cls, num_blocks: int, prompt_len: int, max_tokens: int):
    """admit(seq, 64) of a prompt beside one running 20-token sequence (blocks of 4, margin 2):
    (scheduler, sequence, the state before, what admit returned)."""
    sched = _scheduler(cls, num_blocks=num_blocks, block_size=4)
    _run_prefill(sched, _sequence(sched, 0, seeded_tokens(20, seed=3)))
    seq = _sequence(sched, 1, seeded_tokens(prompt_len, seed=prompt_len), max_tokens=max_tokens)
    sched.add(seq)
    before = _snapshot(sched)
    return sched, seq, before, sched.admit(seq, 64)


def _admit_counts_what_it_holds(cls, proved: Proved) -> None:
    """Room with blocks to spare: admitted, whatever output the sequence may still generate."""
    sched, seq, _, got = _crowded_admit(cls, num_blocks=10, prompt_len=4, max_tokens=16)
    if got == 4:
        proved.note("room counted for the tokens a sequence holds, not the output it may generate")
        return
    what = ("one sequence running, 5 of 10 blocks free (blocks of 4), margin 2: admit of a 4-token prompt "
            "with max_tokens=16 (needs 1 block + 2)")
    *_, short = _crowded_admit(cls, num_blocks=10, prompt_len=4, max_tokens=1)
    if got == 0 and short == 4:
        fail(f"{what} returned", 4, 0, "the same prompt with max_tokens=1 is admitted, so admit counted the "
             "output the sequence may still generate: 4 + 16 tokens need 5 blocks, + 2 of margin > 5 free. "
             "Count only the tokens the sequence holds that attach did not reuse (len(seq.tokens) - reused); "
             "the margin is what covers the output as it grows")
    expect_equal(got, 4, f"{what} returned", "3 blocks of the 5 free suffice: admit it, with this step's chunk")


def _admit_keeps_the_margin(cls, proved: Proved) -> None:
    """3 free blocks, margin 2: a prompt needing 1 block fits exactly; 2 or 3 blocks are refused unchanged."""
    for prompt_len, fits in ((6, False), (9, False), (4, True)):
        sched, seq, before, got = _crowded_admit(cls, num_blocks=8, prompt_len=prompt_len, max_tokens=8)
        what = (f"one sequence running, 3 of 8 blocks free (blocks of 4), margin 2 blocks: admit of a "
                f"{prompt_len}-token prompt (needs {ceil_div(prompt_len, 4)} block(s) + 2)")
        if fits:
            expect_equal(got, prompt_len, f"{what} returned",
                         "the prompt and the margin fit exactly: free blocks >= needed + margin admits")
            continue
        if got:
            blocks = ceil_div(prompt_len, 4)
            hint = NO_ROOM_CHECK if blocks > 3 else (
                f"the prompt fits but leaves {3 - blocks} free block(s), fewer than margin() = 2: " + NO_ROOM_CHECK)
            fail(f"{what}: returned", 0, got, hint)
        if seq.seq_id in sched.cache.tables:
            fail(f"{what}: admit refused, but the sequence still has a table in the cache",
                 hint="a refusal must change nothing: undo the attach with self.detach(seq)")
        expect_equal(_snapshot(sched), before, f"{what}: the state after a refusal",
                     "a refusal must change nothing (self.detach(seq) undoes the attach)")
    proved.note("the margin kept free, with an exact fit admitted")
    proved.note("refusals change nothing")


def _admit_reuses_the_prefix(cls, proved: Proved) -> None:
    """Cached prefix tokens are not prefilled nor counted as needed; unused cached blocks are evicted."""
    sched = _scheduler(cls, num_blocks=6, block_size=4, prefix=True)
    shared = seeded_tokens(12, seed=7)
    first = _sequence(sched, 0, shared + [1, 2])
    _run_prefill(sched, first)
    sched.publish(first)
    sched.finish(first, "length")                           # 3 full blocks stay cached, unused
    filler = _sequence(sched, 2, seeded_tokens(20, seed=8))
    seq = _sequence(sched, 1, shared + [9, 9, 9])
    sched.add(seq)
    stats = dict(sched.prefix_stats)
    got = sched.admit(seq, 64)
    what = "a 15-token prompt whose first 12 tokens are cached (blocks of 4), 3 blocks free: admit returned"
    if got == 0:
        fail(what, 3, 0, "the cached tokens already have their blocks: need = self.cache.blocks_wanted("
             "seq.seq_id, len(seq.tokens) - reused) + self.margin(), the tokens attach did not reuse "
             "(1 block here), not the whole prompt")
    expect_equal(got, 3, what, "only the uncached tokens are prefilled: set seq.num_computed = seq.cached_tokens = "
                 "what self.attach(seq) returned, then count = min(seq.num_pending, budget)")
    expect_equal((seq.num_computed, seq.cached_tokens), (12, 12), "(num_computed, cached_tokens) after that admit",
                 "set both to what self.attach(seq) returned: seq.num_computed = seq.cached_tokens = reused")
    expect_equal(dict(sched.prefix_stats), stats, "self.prefix_stats after admit (schedule() counts the lookup "
                 "once admit returns)", "admit counted the prefix lookup itself (self.count_prefix_hit): "
                 "schedule() calls count_prefix_hit after a successful admit, so every lookup counted twice. "
                 "Leave the statistics to schedule()")
    proved.note("cached prefix tokens skipped and the lookup left to schedule() to count")
    sched.finish(seq, "length")
    sched.add(filler)
    got = sched.admit(filler, 64)
    expect_equal(got, 20, "6 blocks, 3 held only by the prefix cache, 3 free: admit of a 20-token prompt",
                 "blocks only the prefix cache holds are free to take: use self.make_room(need), which "
                 "evicts them, rather than comparing with free_blocks() alone")
    proved.note("unused cached blocks evicted to make room")


# The notebook's names of the scheduler exercises' classes, the latest first, as the test cells pass them.
SCHEDULERS = ("Sampling (Exercise 7.4)", "Preemption (Exercise 7.2)", "Admission (Exercise 7.1)")


def _naming_earlier(subject: str, latest: str, earlier):
    """compose.naming_earlier_pieces around a check of exercise `latest`'s class: each earlier class given is
    probed with its own exercise's checks (on it and the classes before it)."""
    return naming_earlier_pieces(subject, SCHEDULERS, latest, earlier,
                                 {"Preemption": (check_choose_victim, check_preempt, check_reserve_or_preempt),
                                  "Admission": (check_admit,)},
                                 {"Preemption": "reserve_or_preempt, choose_victim and preempt", "Admission": "admit"})


def your_scheduler(*classes, latest: str = "Sampling"):
    """One Scheduler class from the exercises' classes given, from the one named `latest` back to Admission
    (each a subclass of the engine's Scheduler, or of the class before it): an instance of it is an instance of
    each, so super() and the learner's helpers work wherever a check calls them (see compose.together). A
    CheckFailed in the notebook's names when Python finds no method order for them."""
    if len(classes) == 1:
        return classes[0]
    start = next(i for i, label in enumerate(SCHEDULERS) if label.startswith(latest + " "))
    return one_class("YourScheduler", SCHEDULERS[start:start + len(classes)], *classes)


@check
def check_admit(cls) -> None:
    """admit(seq, budget): reserves the first chunk before any compute, counts room for what the sequence
    holds, keeps the margin free, refuses without changing anything, evicts unused cached blocks first,
    and counts reused prefix tokens (but not the lookup: schedule() does)."""
    proved = Proved("admit")
    _admit_first_chunk(cls, proved)
    _admit_counts_what_it_holds(cls, proved)
    _admit_keeps_the_margin(cls, proved)
    _admit_reuses_the_prefix(cls, proved)
    proved.passed()


# ---- exercise 7.2: preemption -----------------------------------------------------------------

@check
def check_choose_victim(cls, *earlier) -> None:
    """choose_victim(scheduled): the newest running sequence not yet scheduled in this step."""
    with _naming_earlier("check_choose_victim", "Preemption", earlier):
        _check_choose_victim(your_scheduler(cls, *earlier, latest="Preemption"))


def _check_choose_victim(cls) -> None:
    """check_choose_victim's work, on the learner's pieces as one class."""
    for count in (2, 3, 5):
        sched = _scheduler(cls, num_blocks=4)
        sched.running = [_sequence(sched, i, [i]) for i in range(count)]
        for done in range(count):
            scheduled = {count - 1 - j for j in range(done)}
            got = sched.choose_victim(scheduled)
            want = sched.running[count - 1 - done]
            if got is not want:
                got_id = getattr(got, "seq_id", got)
                if got is sched.running[0]:
                    hint = OLDEST
                elif got_id in scheduled:
                    hint = "that one already has its room for this step: skip the ids in `scheduled`"
                else:
                    hint = ("the victim is the newest eligible one: walk self.running from the end and "
                            "take the first sequence whose seq_id is not in `scheduled`")
                fail(f"running ids {[s.seq_id for s in sched.running]} (oldest first), scheduled "
                     f"{sorted(scheduled)}: choose_victim picked id", want.seq_id, got_id, hint)
    # Admission order is not id order: a re-admitted or swapped-in sequence is appended to self.running.
    order = (3, 0, 4, 1)
    sched = _scheduler(cls, num_blocks=4)
    sched.running = [_sequence(sched, i, [i]) for i in order]
    for scheduled in (set(), {1}, {1, 4}):
        eligible = [i for i in order if i not in scheduled]
        got = sched.choose_victim(scheduled)
        got_id = getattr(got, "seq_id", got)
        if got_id != eligible[-1]:
            hint = BY_ID if got_id == max(eligible) else OLDEST if got_id == eligible[0] else (
                "walk self.running from the end and take the first sequence not in `scheduled`")
            fail(f"running ids {list(order)} (admission order, oldest first), scheduled "
                 f"{sorted(scheduled)}: choose_victim picked id", eligible[-1], got_id, hint)
    passed("choose_victim: always the newest running sequence (by admission) that is not yet scheduled "
           "this step")


def _preempt_case(cls, mode: str, prefix: bool = False, cache_cls=PagedKVCache, **config):
    sched = _scheduler(cls, num_blocks=16, block_size=4, prefix=prefix, cache_cls=cache_cls, preemption=mode, **config)
    old, new = _sequence(sched, 0, seeded_tokens(9, seed=1)), _sequence(sched, 1, seeded_tokens(10, seed=2))
    for seq in (old, new):
        _run_prefill(sched, seq)
        seq.tokens.append(5)                 # one sampled token, not yet computed
    return sched, old, new


def _preempt_publishes(cls, mode: str, cache_cls=PagedKVCache) -> None:
    """With a prefix cache: a recompute publishes the victim's 2 full blocks before their release and before
    the reset; a swap publishes nothing (its K/V come back from the host, and cached blocks would stay in
    the pool, held by the prefix cache)."""
    sched, _, new = _preempt_case(cls, mode, prefix=True, cache_cls=cache_cls)
    # (the victim's num_computed, whether it still had its table) at each publish, noted where sched lives
    record = record_publish(sched)
    free_before = sched.cache.allocator.num_free
    what = f"preempt by {mode} of a 10-token sequence (2 full blocks of 4) with a prefix cache"
    try:
        sched.preempt(new)
    except KeyError as error:
        calls = recorded(record, "publish's calls")
        if calls and not calls[-1][1]:
            fail(f"{what} raised KeyError: {error}", hint="publish ran after the release, when the sequence had "
                 "no blocks left to offer: publish first, then release")
        raise
    cached = len(sched.prefix.entries)
    if mode == "swap":
        expect_equal((cached, sched.cache.allocator.num_free), (0, free_before + 3),
                     f"{what}: (blocks in the prefix cache, free blocks)", "a swap does not publish: its K/V "
                     "come back from the host, and published blocks would stay in the pool, held by the prefix "
                     "cache, so the swap would free fewer blocks. Publish only for a recompute")
        return
    if cached:
        return
    calls = recorded(record, "publish's calls")
    if calls and calls[-1][0] == 0:
        hint = ("publish ran after num_computed was reset to 0, so it offered nothing (publish offers the "
                "first seq.num_computed tokens): publish first, then release, then reset the progress")
    elif calls and not calls[-1][1]:
        hint = "publish ran after the release, when the sequence had no blocks left: publish first, then release"
    else:
        hint = ("preempt never published the victim: call self.publish(seq) before releasing it, so "
                "re-admission finds its blocks in the prefix cache")
    fail(f"{what}: blocks in the prefix cache afterwards", 2, 0, hint)


def _swapping_cache(cls):
    """The cache class whose swap a preemption by swap runs: the notebook's PagedKVCache when its swap_out and
    swap_in are written and pass check_swap (Exercise 7.3; read where the learner's scheduler lives, so in the
    grader's host the cache is built there and runs the learner's own swap), else the engine's (a swap bug
    costs Exercise 7.3, not this one)."""
    [notebook_cache] = written_later(cls, (("PagedKVCache", ("swap_out", "swap_in")),))
    return notebook_cache if notebook_cache is not None and _swap_problem(notebook_cache) is None else PagedKVCache


@check
def check_preempt(cls, *earlier) -> None:
    """preempt(seq): frees (or swaps out) the victim's blocks; a recomputed victim goes back to the
    front of the waiting queue to re-prefill all its tokens; a swapped one keeps its progress."""
    with _naming_earlier("check_preempt", "Preemption", earlier):
        _check_preempt(your_scheduler(cls, *earlier, latest="Preemption"))


def _check_preempt(cls) -> None:
    """check_preempt's work, on the learner's pieces as one class."""
    proved = Proved("preempt")
    sched, old, new = _preempt_case(cls, "recompute")
    free_before = sched.cache.allocator.num_free
    mode = sched.preempt(new)
    expect_equal(mode, "recompute", "preempt with SchedulerConfig(preemption='recompute') returned",
                 "return self.preemption_mode(seq), the mode it used")
    if new.seq_id in sched.cache.tables or sched.cache.allocator.num_free != free_before + 3:
        fail("after preempt by recompute of a sequence holding 3 blocks, (still in the cache?, free blocks)",
             (False, free_before + 3), (new.seq_id in sched.cache.tables, sched.cache.allocator.num_free),
             LEAKED)
    if new.num_computed != 0:
        fail("after preempt by recompute, num_computed of the victim", 0, new.num_computed, NOT_RESET)
    expect_equal(len(new.tokens), 11, "after preempt by recompute, the victim's tokens (10 prompt + 1 output)",
                 NOT_RESET)
    expect_equal((_status(new), [s.seq_id for s in sched.waiting], [s.seq_id for s in sched.running]),
                 (Status.WAITING.value, [1], [0]), "after preempt by recompute: (status, waiting ids, running ids)",
                 "take it out of self.running, mark it WAITING and put it at the FRONT of self.waiting")
    sched.preempt(old)
    expect_equal([s.seq_id for s in sched.waiting], [0, 1], "preempting the newest, then the oldest: waiting ids",
                 "appendleft: victims come newest first, so the older one must end up in front")
    expect_equal((old.preemptions, new.preemptions, sched.preemptions), (1, 1, {"recompute": 2, "swap": 0}),
                 "after two recomputes: (oldest's seq.preemptions, newest's seq.preemptions, self.preemptions)",
                 "add one to the victim's seq.preemptions and count each preemption under its mode in "
                 "self.preemptions")
    proved.note("recompute frees the blocks, resets num_computed to 0, queues the victim in front (the newest "
                "first) and counts it in seq.preemptions and self.preemptions")
    _preempt_publishes(cls, "recompute")
    proved.note("a recompute publishes the full blocks before releasing them")
    # swap_out is Exercise 7.3: the notebook's own cache, where written (recompute is checked above)
    with served("preempting by swap", essential=False):
        cache_cls = _swapping_cache(cls)
        # "auto" decides by length: preemption_mode says which, and preempt must follow it.
        for computed in (9, 10):
            sched, old, new = _preempt_case(cls, "auto", cache_cls=cache_cls, swap_min_tokens=computed)
            victim = old if computed == 10 else new   # old (9 computed) recomputes; new (10) swaps
            want, computed_before = sched.preemption_mode(victim), victim.num_computed
            try:
                mode = sched.preempt(victim)
            except KeyError as error:
                fail(f"preempt with SchedulerConfig(preemption='auto', swap_min_tokens={computed}) raised "
                     f"KeyError: {error}", hint="'auto' is not a mode: mode = self.preemption_mode(seq) "
                     "decides between 'swap' and 'recompute'")
            expect_equal(mode, want, f"preempt of a sequence with {computed_before} computed tokens, "
                         f"SchedulerConfig(preemption='auto', swap_min_tokens={computed}): the mode returned",
                         "mode = self.preemption_mode(seq) decides swap or recompute; use it and return it")
        proved.note("'auto' follows preemption_mode")
        # Swap: the K/V go to the host, the progress stays.
        sched, old, new = _preempt_case(cls, "swap", cache_cls=cache_cls)
        free_before = sched.cache.allocator.num_free
        mode = sched.preempt(new)
        expect_equal(mode, "swap", "preempt with SchedulerConfig(preemption='swap') returned")
        if new.seq_id not in sched.cache.swapped or sched.cache.allocator.num_free != free_before + 3:
            fail("after preempt by swap of a sequence holding 3 blocks, (swapped out in the cache?, free blocks)",
                 (True, free_before + 3), (new.seq_id in sched.cache.swapped, sched.cache.allocator.num_free),
                 LEAKED)
        expect_equal((_status(new), new.num_computed, [s.seq_id for s in sched.swapped], sched.swapped_tokens),
                     (Status.SWAPPED.value, 10, [1], 10),
                     "after preempt by swap: (status, num_computed, swapped ids, swapped_tokens)",
                     "a swapped victim keeps num_computed (its K/V are on the host), is marked SWAPPED, "
                     "appended to self.swapped, and self.swapped_tokens grows by its num_computed")
        proved.note("swap moves the K/V to the host and keeps the progress")
        _preempt_publishes(cls, "swap", cache_cls)
        proved.note("a swap publishes nothing")
    proved.passed()


@check
def check_reserve_or_preempt(cls, *earlier) -> None:
    """reserve_or_preempt(seq, count, scheduled): reserve; out of blocks, evict unused cached blocks
    first, then preempt choose_victim's pick and retry; False when `seq` itself was the victim."""
    with _naming_earlier("check_reserve_or_preempt", "Preemption", earlier):
        _check_reserve_or_preempt(your_scheduler(cls, *earlier, latest="Preemption"))


def _check_reserve_or_preempt(cls) -> None:
    """check_reserve_or_preempt's work, on the learner's pieces as one class."""

    def crowded():
        sched = _scheduler(cls, num_blocks=11, block_size=4, prefix=True, preemption="recompute")
        done = _sequence(sched, 9, seeded_tokens(4, seed=9) + [1])
        _run_prefill(sched, done)
        sched.publish(done)
        sched.finish(done, "length")           # 1 full block cached, unused (the 5th token: freed)
        seqs = [_sequence(sched, i, seeded_tokens(12, seed=20 + i)) for i in range(3)]
        for seq in seqs:
            _run_prefill(sched, seq)           # 3 full blocks each: the next token needs a new block
            seq.tokens.append(7)
        return sched, seqs
    def leaked(sched, seqs):
        for seq in seqs:
            if seq.status is not Status.RUNNING and seq.seq_id in sched.cache.tables:
                fail(f"after reserve_or_preempt, sequence {seq.seq_id} is {_status(seq)} but still "
                     f"holds {len(sched.cache.tables[seq.seq_id])} block(s)", hint=LEAKED)
    def reserved(sched, seq, count, what):
        room = len(sched.cache.tables.get(seq.seq_id, [])) * sched.cache.block_size
        want = sched.cache.length(seq.seq_id) + count
        if room < want:
            fail(f"{what}: reserve_or_preempt returned True; positions with reserved room for sequence "
                 f"{seq.seq_id}", f">= {want}", room,
                 "return True only once self.cache.reserve(seq.seq_id, count) has succeeded: after "
                 "evicting or preempting, go round the loop and try the reserve again")
    sched, (a, b, c) = crowded()
    ok = sched.reserve_or_preempt(a, 1, set())
    expect_equal((ok, sched.preemptions["recompute"]), (True, 0),
                 "1 block free, reserve one token for the oldest: (returned, preemptions)",
                 "when reserve succeeds, return True and preempt nobody")
    reserved(sched, a, 1, "1 block free, reserve one token for the oldest")
    ok = sched.reserve_or_preempt(b, 1, {a.seq_id})
    expect_equal((ok, sched.preemptions["recompute"], len(sched.prefix.entries)), (True, 0, 0),
                 "no block free, one held only by the prefix cache: (returned, preemptions, cached blocks)",
                 "evict unused prefix-cache blocks (self.evict_for(seq, count)) before preempting anyone")
    reserved(sched, b, 1, "no block free, one held only by the prefix cache")
    ok = sched.reserve_or_preempt(c, 1, {a.seq_id, b.seq_id})
    leaked(sched, (a, b, c))
    expect_equal((ok, _status(c)), (False, Status.WAITING.value),
                 "nothing free or evictable, the newest asks for a block: (returned, its status)",
                 "the newest unscheduled sequence is `seq` itself: preempt it and return False")
    sched, (a, b, c) = crowded()
    sched.evict(sched.cache.allocator.num_blocks)       # nothing left to evict
    sched.reserve_or_preempt(a, 1, set())
    ok = sched.reserve_or_preempt(a, 9, set())           # two more blocks for the oldest, one free
    leaked(sched, (a, b, c))
    states = [_status(s) for s in (a, b, c)]
    want = [Status.RUNNING.value, Status.RUNNING.value, Status.WAITING.value]
    if states[0] != Status.RUNNING.value and states[2] == Status.RUNNING.value:
        fail("the oldest needs a block, nothing free: statuses (oldest, middle, newest)", want, states, OLDEST)
    expect_equal((ok, states), (True, want),
                 "the oldest needs a block, nothing free: (returned, statuses oldest to newest)",
                 "preempt self.choose_victim(scheduled), then try the reserve again")
    reserved(sched, a, 9, "the oldest needs a block, nothing free")
    passed("reserve_or_preempt: reserves when it can, evicts unused cached blocks before preempting, "
           "then preempts the newest and retries; returns False when the victim was the asker")


# ---- exercise 7.3: swap out and swap in ---------------------------------------------------------

def _logical_blocks(cache, seq: int) -> list[list[torch.Tensor]]:
    return [[pool[b].clone() for pool in list(cache.k_pools) + list(cache.v_pools)] for b in cache.tables[seq]]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@check
def check_swap(cache_cls, block_size: int = 4) -> None:
    """swap_out / swap_in: every logical block's K/V come back into the same logical place, in other
    physical blocks; blocks are released on the way out; a swap-in that cannot fit changes nothing."""
    bs, model = block_size, tiny()
    cache = cache_cls(model.config, 24, block_size=bs)
    seqs = {0: seeded_tokens(3 * bs - 1, seed=1), 1: seeded_tokens(bs + 2, seed=2)}
    for s, tokens in seqs.items():
        cache.create(s)
        cached_step(model, cache, [s], [tokens])
    cache.fork(1, 2)
    seqs[2] = list(seqs[1])
    saved, free = _logical_blocks(cache, 0), cache.allocator.num_free
    moved = cache.swap_out(0)
    expect_equal(moved, 3, f"swap_out of a {3 * bs - 1}-token sequence in blocks of {bs}: blocks copied",
                 "return the number of blocks copied: blocks_needed(length, self.block_size)")
    if 0 in cache.tables or cache.allocator.num_free != free + 3:
        fail("after swap_out(0): (sequence 0 still has a table?, free blocks)", (False, free + 3),
             (0 in cache.tables, cache.allocator.num_free), "release every block of the table and drop it")
    expect_equal(cache.length(0), 3 * bs - 1, "after swap_out(0): length(0)",
                 "keep the length in the SwappedSequence, so length() and swap_in know it")
    cache.create(3)                                            # churn: the freed blocks go elsewhere
    cached_step(model, cache, [3], [seeded_tokens(2 * bs, seed=3)])
    seqs[3] = seeded_tokens(2 * bs, seed=3)
    moved = cache.swap_in(0)
    expect_equal(moved, 3, "swap_in(0) of those 3 saved blocks: its return value",
                 "return the number of blocks it allocated and filled")
    if 0 in cache.swapped:
        fail("after swap_in(0): sequence 0 is back in the pool but still in cache.swapped",
             hint="drop the saved copy once it is restored: del self.swapped[seq]")
    restored_length = cache.lengths.get(0)
    if restored_length != 3 * bs - 1:
        fail(f"after swap_out(0) and swap_in(0) of a {3 * bs - 1}-token sequence: self.lengths[0]",
             3 * bs - 1, "no entry: the swapped-in sequence has no length" if restored_length is None
             else restored_length,
             "swap_in must restore the length it saved, self.lengths[seq] = saved.length, beside the new "
             "table" + ("; that is the capacity of its blocks, not the tokens they hold"
                        if restored_length == 3 * bs else ""))
    expect_raises(KeyError, lambda: cache.swap_in(0), "swap_in(0) again, when it is no longer swapped out",
                  "a sequence that is not swapped out has nothing to restore: raise KeyError before "
                  "changing anything")
    restored = _logical_blocks(cache, 0)
    for i, want in enumerate(saved):
        if not _same(restored[i], want):
            elsewhere = [j for j, got in enumerate(restored) if _same(got, want)]
            hint = WRONG_ORDER if elsewhere else ("copy every layer's K and V of each saved block into "
                                                  "the pools at the new block ids")
            where = f"logical block {elsewhere[0]}" if elsewhere else "no block"
            fail(f"after swap_out(0), other allocations, swap_in(0): the K/V saved from logical block {i} "
                 f"are now in", f"logical block {i}", where, hint)
    # A shared sequence swaps out without taking its sharer's blocks, and comes back private.
    shared = list(cache.tables[1])
    cache.swap_out(2)
    expect_equal([cache.allocator.refcount(b) for b in shared], [1] * len(shared),
                 "sequence 2, a fork of 1, swapped out: refcounts of 1's blocks",
                 "release each block once (refcount - 1): sequence 1 still owns them")
    cache.swap_in(2)
    for s in (0, 1, 2, 3):
        new = [100 + s, 101 + s]
        got = cached_step(model, cache, [s], [new])[0]
        seqs[s] = seqs[s] + new
        want = scratch_logits(model, [seqs[s]])[0][-2:]
        hint = WRONG_ORDER if s == 0 else "a swapped sequence must read back exactly its own history"
        compare_logits(got, want, f"after swap out and in, sequence {s} decoding two tokens",
                       first_position=len(seqs[s]) - 2, hint=hint)
    cache.swap_out(0)
    while cache.allocator.num_free:                            # no room left to come back into
        cache.create(10 + cache.allocator.num_free)
        cache.reserve(10 + cache.allocator.num_free, bs)
    free, tables = cache.allocator.num_free, dict(cache.tables)
    try:
        cache.swap_in(0)
    except MemoryError:
        pass
    else:
        fail("swap_in(0) with no free block", "OutOfBlocks (a MemoryError)", "no error",
             "check the free blocks first and raise OutOfBlocks(wanted, free) before changing anything")
    expect_equal((0 in cache.swapped, cache.allocator.num_free, dict(cache.tables)), (True, free, tables),
                 "after a swap_in that could not fit: (still swapped out?, free blocks, tables)",
                 "a failed swap_in must change nothing, so the scheduler can retry later")
    for s in list(cache.tables) + list(cache.swapped):
        cache.free(s)
    expect_equal(cache.allocator.num_free, 24, "after freeing every sequence: free blocks",
                 "swap_in must allocate exactly the blocks it fills")
    passed(f"swap (blocks of {bs}): K/V restored block for block after the freed blocks went to another "
           f"sequence, a shared "
           f"sequence swaps without touching its sharer, logits match from-scratch runs within {ATOL:g}, "
           "a swap-in that cannot fit changes nothing, nothing leaks")


# ---- exercise 7.4: n samples, one prefill ----------------------------------------------------------

def _engine(sched_cls, cache, config=None, model=None, prefix_caching: bool = True, **kwargs):
    """The real Engine over `cache` (made with made_beside(sched_cls, ...)), with the learner's scheduler
    class in place of the engine's. Its scheduler, requests and sequences are made where the learner's
    class lives (in the grader, the learner's process): the grader's engine holds them, never the reverse."""
    engine = Engine(model or tiny(), cache, config, prefix_caching=False, **kwargs)
    prefix = prefix_caching and implements(cache, PagedCache)
    engine.scheduler = _scheduler_over(sched_cls, cache, dataclasses.asdict(engine.scheduler.config), prefix)
    engine.make_request = functools.partial(made_beside, engine.scheduler, Request)
    engine.make_sequence = functools.partial(made_beside, engine.scheduler, Sequence)
    engine._seq_ids = _new_ids(engine.scheduler)
    engine.generator_of = _own_copies()
    return engine


def _own_copies():
    """Engine.generator_of that keeps a copy of each sequence's generator, read the first time that
    sequence samples (as its maker seeded it), and draws from that copy after: a generator read from the
    learner's process is a copy, and a fresh copy each step would draw the same number again."""
    copies: dict = {}

    def generator_of(seq):
        if seq.seq_id not in copies:
            copies[seq.seq_id] = seq.generator
        return copies[seq.seq_id]
    return generator_of


@where_it_lives
def _scheduler_over(sched_cls, cache, config: dict, prefix: bool):
    """sched_cls over `cache` and SchedulerConfig(**config), with a PrefixCache over the cache when `prefix`."""
    return sched_cls(cache, SchedulerConfig(**config), PrefixCache(cache) if prefix else None)


@where_it_lives
def _new_ids(sched):
    """The sequence ids of an engine whose scheduler is `sched`, counted where it lives."""
    return itertools.count()


def _solo(prompt, params, seed):
    """What one sample with `seed` draws, from scratch (no cache, no scheduler): the serving engine's
    solo run of the request draws the same tokens from the same generator."""
    return generate(tiny(), [prompt], dataclasses.replace(params, seed=seed))[0].tokens


@check
def check_parallel_sampling(cls, *earlier, n: int = 4, seed: int = 100) -> None:
    """A request for n samples: one prefill, then n sequences that share the prompt's full blocks, each
    drawing with seed + i; every sample equals a solo run of the same request with that seed."""
    with _naming_earlier("check_parallel_sampling", "Sampling", earlier):
        _check_parallel_sampling(your_scheduler(cls, *earlier, latest="Sampling"), n, seed)


def _check_parallel_sampling(cls, n: int = 4, seed: int = 100) -> None:
    """check_parallel_sampling's work, on the learner's pieces as one class."""
    bs = 4
    prompt = seeded_tokens(3 * bs + 1, seed=11)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, ignore_eos=True)
    cache = made_beside(cls, PagedKVCache, tiny().config, 32, block_size=bs)
    engine = _engine(cls, cache, prefix_caching=False)
    request = engine.add_request(prompt, params, seed=seed, n=n)
    engine.step()
    expect_equal(len(request.sequences), n, f"after the prefill step of a request for n={n}: its sequences",
                 "fork_samples must create n - 1 new sequences and append each to request.sequences")
    ids = [s.seq_id for s in request.sequences]
    if len(set(ids)) != n or not all(i in cache.tables for i in ids):
        fail("after the prefill step: sequence ids with a table in the cache", f"{n} distinct", ids,
             "give each child next(new_ids) and cache.fork(seq.seq_id, child.seq_id)")
    parent = request.sequences[0]
    running = {s.seq_id for s in engine.scheduler.running}
    states = [(s.sample_index, s.num_computed, _status(s), s.seq_id in running)
              for s in request.sequences]
    expect_equal(states, [(i, parent.num_computed, Status.RUNNING.value, True) for i in range(n)],
                 "after the prefill step: (sample_index, num_computed, status, in self.running) of every "
                 "sample", "child i is Sequence(..., sample_index=i) and starts where its parent is: "
                 "child.num_computed = seq.num_computed (its prompt is in the shared blocks), status "
                 "Status.RUNNING, appended to self.running")
    full = [cache.tables[ids[0]][i] for i in range(3)]
    expect_equal([cache.allocator.refcount(b) for b in full], [n] * 3,
                 "after the prefill step: refcounts of the prompt's 3 full blocks",
                 f"each child shares every block of the parent (cache.fork): {n} owners each")
    expect_equal(cache.allocator.num_free, 32 - 4, "after the prefill step: free blocks",
                 "a fork allocates nothing: the prompt's 4 blocks are stored once")
    if any(s.tokens is request.sequences[0].tokens for s in request.sequences[1:]):
        fail("a child's token list is the parent's list itself",
             hint="give each child a copy, list(seq.tokens): every sample appends its own tokens")
    engine.run()
    solos = [_solo(prompt, params, seed + i) for i in range(n)]
    for i, sample in enumerate(request.outputs):
        if sample != solos[i]:
            same = [j for j in range(n) if solos[j] == sample]
            hint = (f"it drew what seed {seed + same[0]} draws: " if same else "") + (
                "sample i must draw from its own generator, make_generator(request.seed + i)")
            fail(f"sample {i} of a request for n={n} with seed {seed}, compared with a solo run with seed "
                 f"{seed + i}", solos[i], sample, hint)
    if len({tuple(o) for o in request.outputs}) < 2:
        fail(f"{n} samples with different seeds all drew {request.outputs[0]}",
             hint="each sample needs its own generator, seeded request.seed + i")
    expect_equal(cache.allocator.num_free, 32, "after every sample finished: free blocks")
    passed(f"parallel sampling: one prefill, {n} samples sharing the prompt's 3 full blocks (refcount {n}), "
           f"each equal to a solo run with its own seed")


# ---- the milestone -------------------------------------------------------------------------------

def _diagnose_leak(engine) -> str:
    cache = engine.cache
    for request in engine.requests.values():
        for seq in request.sequences:
            if seq.seq_id in cache.tables and _status(seq) != "running":
                return (f"sequence {seq.seq_id} is {_status(seq)} but still holds "
                        f"{len(cache.tables[seq.seq_id])} block(s): {LEAKED}")
    return LEAKED


def pressure_engine(sched_cls, cache_cls, block_size: int = 4, seed: int = 0):
    """The milestone's workload, queued: ragged prompts on a pool that holds the longest request plus
    4 blocks, greedy, 21 output tokens each. Returns (engine, requests); nothing has run yet."""
    bs = block_size
    lengths = [bs - 1, bs, bs + 1, 2 * bs + 1, 3 * bs + 2, 4 * bs + 3]
    prompts = [seeded_tokens(n, seed=seed * 100 + i) for i, n in enumerate(lengths)]
    params = SamplingParams(max_tokens=21, ignore_eos=True)
    # Room for the longest request plus 4 blocks; victims of 6 blocks or more swap, shorter ones recompute.
    cache = made_beside(sched_cls, cache_cls, tiny().config, ceil_div(4 * bs + 3 + 21, bs) + 4, block_size=bs)
    config = SchedulerConfig(max_batched_tokens=4 * bs, margin_blocks=1, watermark=0.0,
                             preemption="auto", swap_min_tokens=6 * bs)
    engine = _engine(sched_cls, cache, config, keep_logits=True)
    engine.swapped_out = set()                 # which sequences went through swap, for the hints
    engine.preempt_modes = {}                  # seq id -> the modes preempt returned for it
    engine.preempted = []                      # victims' ids, in the order they were preempted
    engine.victims = []                        # (asker id, ids it could preempt, oldest first, victims)
    # The calls are recorded where the scheduler and the cache live (in the grader, the notebook's process:
    # engine.checks.recording); pressure_run reads them into the four attributes above, as data.
    engine.records = (record_swap_out(cache), record_preemption(engine.scheduler))
    return engine, [engine.add_request(p, params) for p in prompts]


def pressure_run(sched_cls, cache_cls, block_size: int = 4, seed: int = 0, abort: bool = True):
    """Run the milestone's workload to the end, aborting one request after 12 steps (if `abort`).
    Returns (engine, requests, aborted request id or None)."""
    engine, requests = pressure_engine(sched_cls, cache_cls, block_size, seed)
    victim = requests[2].request_id if abort else None
    steps = 0
    while engine.has_unfinished():
        try:
            engine.step()
        except ValueError as error:
            if "reserved room" in str(error):
                swap = _swap_problem(cache_cls)
                fail(f"engine step {steps + 1}: the forward wrote where nothing was reserved ({error})",
                     hint=f"check_swap fails on your swap_out and swap_in: {swap}" if swap else NO_RESERVE)
            if "already exists" in str(error):
                fail(f"engine step {steps + 1}: a sequence coming back found itself still in the cache "
                     f"({error})", hint=LEAKED)
            raise
        except RuntimeError as error:
            if "stuck" in str(error):
                fail(f"engine step {steps + 1}: {error}", hint=_diagnose_leak(engine))
            raise
        steps += 1
        if steps == 12 and victim is not None:
            engine.abort(victim)
        if steps > 2000:
            fail("the engine ran 2000 steps without finishing", hint="is a preempted sequence ever "
                 "admitted again? (recompute: front of self.waiting; swap: self.swapped)")
    _read_records(engine)
    return engine, requests, victim


def _read_records(engine) -> None:
    """What pressure_engine's recorders noted, as data, into engine.swapped_out, preempt_modes, preempted
    and victims."""
    swaps, preemption = engine.records
    engine.swapped_out = set(recorded(swaps, "swap_out's calls"))
    engine.preempt_modes, engine.preempted, engine.victims = {}, [], []
    for entry in recorded(preemption, "preempt's and reserve_or_preempt's calls"):
        if entry[0] == "preempt":
            engine.preempt_modes.setdefault(entry[1], []).append(entry[2])
            engine.preempted.append(entry[1])
        elif entry[0] == "victims":
            engine.victims.append((entry[1], list(entry[2]), list(entry[3])))


def _victim_problem(engine) -> None:
    """Fail at the first preemption that did not take the newest sequences not yet scheduled."""
    for asker, eligible, victims in engine.victims:
        newest_first = eligible[::-1][:len(victims)]
        if victims == newest_first:
            continue
        if victims == eligible[:len(victims)]:
            hint = OLDEST
        elif victims == sorted(eligible, reverse=True)[:len(victims)]:
            hint = BY_ID
        elif any(v not in eligible for v in victims):
            hint = "a sequence already scheduled this step has its room: never preempt it (skip `scheduled`)"
        else:
            hint = "preempt self.choose_victim(scheduled): the newest running sequence not yet scheduled"
        fail(f"sequence {asker} needed room while sequences {eligible} (admission order, oldest first) "
             f"were running and not yet scheduled this step: the ones preempted", newest_first, victims,
             hint)


def _scheduler_problem(sched_cls) -> str | None:
    """The first scheduler check that fails on sched_cls (run quietly), in words, or None."""
    for probe in (check_admit, check_choose_victim, check_preempt, check_reserve_or_preempt,
                  check_parallel_sampling):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                probe.__wrapped__(sched_cls)
        except CheckFailed as failure:
            return f"{probe.__name__} fails on your scheduler too: " + str(failure).replace(". Hint: ", "; its hint: ")
        except Exception:  # a crash in a probe says no more than the crash itself
            continue
    return None


def _swap_problem(cache_cls) -> str | None:
    """check_swap's failure message on cache_cls (run quietly), or None when it passes."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            check_swap.__wrapped__(cache_cls)
    except CheckFailed as failure:
        return str(failure).replace(". Hint: ", "; its hint: ")
    except Exception as error:  # a crash in the probe: report it plainly
        return f"it crashes with {type(error).__name__}: {error}"
    return None


def _outputs_match(engine, kept, solos, hint_for) -> None:
    """Each kept request's logits against a from-scratch run and its output against its solo run; the hint
    (which may replay check_swap) is asked only on a failure."""
    for request, generation in zip(kept, solos):
        seq, solo = request.sequences[0], generation.tokens
        what = (f"request {request.request_id} ({len(request.prompt)}-token prompt, preempted "
                f"{seq.preemptions} time(s){', swapped' if seq.seq_id in engine.swapped_out else ''})")
        if len(seq.logits) != len(seq.output):
            fail(f"{what}: logit rows kept vs output tokens", len(seq.output), len(seq.logits), hint_for(seq))
        want = scratch_logits(tiny(), [seq.tokens])[0][seq.prompt_len - 1:-1]
        hint = functools.partial(hint_for, seq)      # asked only on a failure: it may replay check_swap
        compare_logits(torch.stack(list(seq.logits)), want, what, first_position=seq.prompt_len - 1, hint=hint)
        expect_equal(request.outputs[0], solo, f"{what}: its output against a solo run", hint)


def served_text(sched_cls, cache_cls):
    """A run for continuations: the trained model's prompt served by the engine with the learner's scheduler
    and cache, after two other requests, on a pool that holds the prompt's request and 5 blocks of 3. The
    prompt's sequence, the newest, is preempted twice: by recompute first, then by swap mid-block."""
    from engine.tokenizer import ByteTokenizer

    def run(model, prompt: list[int], tokens: int) -> list[int]:
        bs, others = 3, [ByteTokenizer().encode(text) for text in ("A paged KV cache", "Copy-on-write")]
        cache = made_beside(sched_cls, cache_cls, model.config, ceil_div(len(prompt) + tokens, bs) + 5, block_size=bs)
        config = SchedulerConfig(max_batched_tokens=4 * bs, margin_blocks=1, watermark=0.0, preemption="auto",
                                 swap_min_tokens=len(prompt) + 3)
        engine = _engine(sched_cls, cache, config, model=model)
        return continuations.served(engine, others + [prompt], tokens)[-1]

    return run


@check
def check_serving_under_pressure(sched_cls, cache_cls, block_size: int = 4, seed: int = 0) -> None:
    """The milestone: your scheduler and your swap in the real engine, a pool so small that requests
    are preempted by both recompute and swap; every output equals its solo run, every logit a
    from-scratch run within 1e-5, and no block leaks once everything finished or was aborted.
    `sched_cls` is one class, or the exercises' classes (Sampling, Preemption, Admission) to put together."""
    if isinstance(sched_cls, tuple):
        sched_cls = your_scheduler(*sched_cls)
    try:
        engine, requests, victim = pressure_run(sched_cls, cache_cls, block_size, seed)
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as error:
        swap = _swap_problem(cache_cls)
        why = f"check_swap fails on your swap_out and swap_in: {swap}" if swap else _scheduler_problem(sched_cls)
        if why is None:
            raise
        fail(f"serving under pressure crashed with {type(error).__name__}: {error}", hint=why)
    sched = engine.scheduler
    kept = [r for r in requests if r.request_id != victim]
    solos = generate(tiny(), [r.prompt for r in kept], kept[0].params)   # from scratch, one batch
    scheduler_problem: list = []           # _scheduler_problem(sched_cls), asked once, on the first failure

    def hint_for(seq) -> str:
        modes = engine.preempt_modes.get(seq.seq_id, [])
        problem = _swap_problem(cache_cls) if seq.seq_id in engine.swapped_out else None
        if problem:
            return f"it went through your swap_out and swap_in, and check_swap fails on them: {problem}"
        if modes and not scheduler_problem:
            scheduler_problem.append(_scheduler_problem(sched_cls))
        if modes and scheduler_problem[0]:       # the first failure, not the symptom it causes here
            return f"it was preempted, and {scheduler_problem[0]}"
        if "recompute" in modes:
            return NOT_RESET
        if modes:
            return ("it was swapped out and back in, and check_swap passes: preempt by swap must keep "
                    "num_computed and the tokens, and queue the sequence in self.swapped")
        return "it was never preempted: did admit or reserve_or_preempt schedule the right tokens?"

    with shows_text(lambda: continuations.shown(served_text(sched_cls, cache_cls))):
        _outputs_match(engine, kept, solos, hint_for)
    _victim_problem(engine)
    cache = engine.cache
    if cache.tables or cache.swapped:
        fail("after every request finished or was aborted, sequences still in the cache",
             [], sorted(list(cache.tables) + list(cache.swapped)), _diagnose_leak(engine))
    if sched.prefix is not None:
        sched.prefix.reset()
    expect_equal(cache.allocator.num_free, cache.allocator.num_blocks,
                 "after everything finished and the prefix cache was emptied: free blocks", hint=LEAKED)
    if not (sched.preemptions["recompute"] and sched.preemptions["swap"]):
        fail("a pool that holds about two of six requests, preemption='auto': preemptions by mode",
             "both recompute and swap > 0", sched.preemptions, _scheduler_problem(sched_cls) or
             "preempt must use self.preemption_mode(seq) and count each preemption in self.preemptions")
    aborted = [r for r in requests if r.request_id == victim and getattr(r, "aborted", False)]
    passed(f"serving under pressure (blocks of {block_size}): {sched.preemptions['recompute']} recompute "
           f"and {sched.preemptions['swap']} swap preemptions" + (", one request aborted mid-run" if aborted else "")
           + f"; every output equals its solo run, every logit a from-scratch run within {ATOL:g}; no block leaked")


# ---- auto-graded review questions ----------------------------------------------------------------

@check
def check_review_margin(answer) -> None:
    """R1: the admission margin of a 2,048-block pool, margin_blocks=2, watermark=0.01, with sequences
    running: max(2, ceil(0.01 * 2048)) = 21 blocks."""
    review_number(answer, "R1", "r1_answer", 21,
                  "21 free blocks kept beyond the newcomer's prompt (1% of 2,048, rounded up)",
                  "is not the margin in blocks", "margin() = max(margin_blocks, ceil(watermark * pool blocks))",
                  {20: "round the watermark up: ceil(0.01 * 2048)", 20.48: "a margin is whole blocks: round up",
                   2: "margin_blocks is the floor; the watermark's 1% of the pool is larger here, so it wins",
                   0: "the margin is 0 only while nothing runs; here sequences are running"},
                  unit="a number of blocks")


@check
def check_review_victim(answer) -> None:
    """R2: the newest request (C, 40 tokens computed) is preempted, by recompute (below 128 tokens)."""
    review_choice(answer, "R2", "r2_answer", "b",
                  "C, the newest, by recompute: 40 computed tokens are below swap_min_tokens = 128",
                  "is not what the scheduler does",
                  {"a": "A is the oldest: preemption takes the newest first",
                   "c": "C is the right victim, but with 40 computed tokens (< swap_min_tokens = 128) 'auto' "
                        "recomputes it",
                   "d": "B is neither the newest nor preempted before C"})


@check
def check_review_swap_ms(answer) -> None:
    """R3: swapping a 2,000-token Llama-2-13B sequence (800 KiB per token, fp16) out and back in over a
    25 GB/s host link: 2 * 2000 * 819,200 B / 25e9 B/s = 131 ms."""
    want = 2 * 2000 * 819_200 / 25e9 * 1e3
    review_number(answer, "R3", "r3_answer", want, f"about {want:.0f} ms of link time for one swap out and back in",
                  "ms is not the swap time",
                  "bytes = tokens x KV bytes per token; time = bytes / (25e9 bytes/s), once out and once back in",
                  {want / 2: "that is one direction: a swapped sequence crosses the link twice, out and back in",
                   want / 1e3: "that is in seconds: the question asks for milliseconds"},
                  unit="a number of milliseconds", rel=0.02)
