"""The chapter-7 checks pass on the engine's scheduler and cache, fail on stubs, and fail on the
chapter's classic bugs, each with its own hint."""
import sys

import pytest

from engine.cache.paged import PagedKVCache
from engine.checks import ch07
from engine.serve.request import Status
from engine.serve.scheduler import Scheduler
from fixtures.check_support import by_name, cases, fails, fails_with, hosted, mutant, passes, stub

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEDULER_CHECKS = [ch07.check_admit, ch07.check_choose_victim, ch07.check_preempt,
                    ch07.check_reserve_or_preempt, ch07.check_parallel_sampling]


def serving(scheduler, cache):
    """The serving check on a scheduler and cache class, as a check of one (unused) object."""
    return lambda _: ch07.check_serving_under_pressure(scheduler, cache)


@pytest.mark.parametrize("check", SCHEDULER_CHECKS, ids=by_name)
def test_reference_scheduler_passes(check):
    passes(check, Scheduler)


def test_reference_swap_passes():
    passes(ch07.check_swap, PagedKVCache)
    passes(ch07.check_swap, PagedKVCache, block_size=2)


@pytest.mark.parametrize("block_size, seed", [(4, 0), (2, 1)])
def test_reference_serving_passes(block_size, seed):
    out = passes(ch07.check_serving_under_pressure, Scheduler, PagedKVCache, block_size=block_size, seed=seed)
    assert "recompute" in out and "swap" in out


# ---- stubs ----------------------------------------------------------------------------------------

StubScheduler = stub(Scheduler, "admit", "reserve_or_preempt", "choose_victim", "preempt", "fork_samples",
                     name="StubScheduler")
StubCache = stub(PagedKVCache, "swap_out", "swap_in", name="StubCache")


@pytest.mark.parametrize("check", SCHEDULER_CHECKS, ids=by_name)
def test_stub_scheduler_is_not_implemented(check):
    assert "not implemented yet" in fails(check, StubScheduler)


def test_stub_cache_is_not_implemented():
    assert "not implemented yet" in fails(ch07.check_swap, StubCache)
    assert "not implemented yet" in fails(serving(StubScheduler, StubCache), None)


# ---- planted bugs: the engine's method with the edit shown as a diff, or written anew ----------------

# A recomputed victim goes back to the queue still holding its blocks.
PreemptNeverFrees = mutant(Scheduler, "preempt", """
-        self.publish(seq)
-        self.release(seq)
""", name="PreemptNeverFrees")
# preempt takes the mode from the config, so "auto" is never resolved.
ModeFromConfig = mutant(Scheduler, "preempt", """
-    mode = self.preemption_mode(seq)
+    mode = self.config.preemption
""", name="ModeFromConfig")
# A recomputed victim keeps its num_computed, as if its K/V were still there.
# A recompute victim is reset but never queued again: it waits nowhere, and its request never finishes.
PreemptNeverRequeues = mutant(Scheduler, "preempt", """
-        self.waiting.appendleft(seq)
+        pass
""", name="PreemptNeverRequeues")
RecomputeNotReset = mutant(Scheduler, "preempt", """
-        seq.num_computed = 0
""", name="RecomputeNotReset")


class AdmitWithoutReserving(Scheduler):
    """Lets the sequence in and schedules its chunk, with no room check and no reserve."""

    def admit(self, seq, budget):
        seq.num_computed = seq.cached_tokens = self.attach(seq)
        seq.status = Status.RUNNING
        self.running.append(seq)
        return min(seq.num_pending, budget)


class AdmitWithoutRoomCheck(Scheduler):
    """Reserves the chunk, but never asks whether the prompt and the margin fit."""

    def admit(self, seq, budget):
        seq.num_computed = seq.cached_tokens = self.attach(seq)
        count = min(seq.num_pending, budget)
        try:
            self.cache.reserve(seq.seq_id, count)
        except MemoryError:
            self.release(seq)
            return 0
        seq.status = Status.RUNNING
        self.running.append(seq)
        return count


# Asks room for the whole prompt, the blocks attach already shared included.
AdmitCountsCachedTokens = mutant(Scheduler, "admit", """
-    need = self.cache.blocks_wanted(seq.seq_id, len(seq.tokens) - reused)
+    need = self.cache.blocks_wanted(seq.seq_id, len(seq.tokens))
""", name="AdmitCountsCachedTokens")
# Counts the prefix lookup in admit too: schedule() already does, so every lookup counts twice.
AdmitCountsPrefixHit = mutant(Scheduler, "admit", """
-    self.running.append(seq)
+    self.running.append(seq)
+    self.count_prefix_hit(seq)
""", name="AdmitCountsPrefixHit")
# Asks room for the output the sequence may still generate, as a slot cache sized up front would.
AdmitCountsFutureOutput = mutant(Scheduler, "admit", """
-    need = self.cache.blocks_wanted(seq.seq_id, len(seq.tokens) - reused)
+    need = self.cache.blocks_wanted(seq.seq_id, seq.max_length - reused)
""", name="AdmitCountsFutureOutput")
# Resets the progress first, so publish (of the first num_computed tokens) offers nothing.
PreemptResetsBeforePublish = mutant(Scheduler, "preempt", """
-        self.publish(seq)
-        self.release(seq)
-        seq.num_computed = 0
+        seq.num_computed = 0
+        self.publish(seq)
+        self.release(seq)
""", name="PreemptResetsBeforePublish")
# Publishes a swapped victim too: its full blocks stay in the pool, held by the prefix cache.
PreemptPublishesSwap = mutant(Scheduler, "preempt", """
-        self.release(seq, swap=True)
+        self.publish(seq)
+        self.release(seq, swap=True)
""", name="PreemptPublishesSwap")
# Returns True as soon as eviction freed something, without reserving again.
TrueAfterEvicting = mutant(Scheduler, "reserve_or_preempt", """
-                continue
+                return True
""", name="TrueAfterEvicting")
OldestVictim = mutant(Scheduler, "choose_victim", """
-    return next(s for s in reversed(self.running) if s.seq_id not in scheduled)
+    return next(s for s in self.running if s.seq_id not in scheduled)
""", name="OldestVictim")
# Chooses the largest id instead of the last admitted (ids and admission order part after a preemption).
VictimById = mutant(Scheduler, "choose_victim", """
-    return next(s for s in reversed(self.running) if s.seq_id not in scheduled)
+    return max((s for s in self.running if s.seq_id not in scheduled), key=lambda s: s.seq_id)
""", name="VictimById")
# Restores the blocks and the table but never the length.
SwapInForgetsLength = mutant(PagedKVCache, "swap_in", """
-    self.tables[seq], self.lengths[seq] = blocks, saved.length
+    self.tables[seq] = blocks
""", name="SwapInForgetsLength")
# Restores the length as the capacity of the new blocks.
SwapInLengthIsCapacity = mutant(PagedKVCache, "swap_in", """
-    self.tables[seq], self.lengths[seq] = blocks, saved.length
+    self.tables[seq], self.lengths[seq] = blocks, len(blocks) * self.block_size
""", name="SwapInLengthIsCapacity")
# Restores the saved blocks into the new blocks, then lists the new blocks backwards.
SwapInWrongOrder = mutant(PagedKVCache, "swap_in", """
-    self.tables[seq], self.lengths[seq] = blocks, saved.length
+    self.tables[seq], self.lengths[seq] = blocks[::-1], saved.length
""", name="SwapInWrongOrder")
# Copies each saved block's keys into both pools: the values of the whole history are keys.
SwapInValuesFromKeys = mutant(PagedKVCache, "swap_in", """
-            v_pool[index] = saved.values[layer].to(self.device)
+            v_pool[index] = saved.keys[layer].to(self.device)
""", name="SwapInValuesFromKeys")
SwapOutKeepsBlocks = mutant(PagedKVCache, "swap_out", """
-    for block in table:
-        self.allocator.release(block)
""", name="SwapOutKeepsBlocks")
# Restores the blocks but leaves the sequence listed as swapped out.
SwapInKeepsSavedCopy = mutant(PagedKVCache, "swap_in", """
-    del self.swapped[seq]
""", name="SwapInKeepsSavedCopy")
# Returns 0 for a sequence that is not swapped out instead of raising.
SwapInWithoutKeyError = mutant(PagedKVCache, "swap_in", """
-        raise KeyError(f"sequence {seq} is not swapped out")
+        return 0
""", name="SwapInWithoutKeyError")
# Children forget that the prompt is already in the shared blocks.
ForkStartsFromZero = mutant(Scheduler, "fork_samples", """
-        child.num_computed, child.status = seq.num_computed, Status.RUNNING
+        child.num_computed, child.status = 0, Status.RUNNING
""", name="ForkStartsFromZero")
# Every sample draws with the request's own seed.
ForkSharesSeed = mutant(Scheduler, "fork_samples", """
-                         make_generator(request.seed + index), sample_index=index)
+                         make_generator(request.seed), sample_index=index)
""", name="ForkSharesSeed")
ForkAliasesTokens = mutant(Scheduler, "fork_samples", """
-        child = Sequence(next(new_ids), request, list(seq.tokens),
+        child = Sequence(next(new_ids), request, seq.tokens,
""", name="ForkAliasesTokens")


@pytest.mark.parametrize("check, bug, words", cases({
    ch07.check_preempt: {
        PreemptNeverFrees: ["blocks were never freed", "expected (False,"],
        RecomputeNotReset: ["num_computed of the victim", "not reset to re-prefill"],
        ModeFromConfig: ["preemption='auto'", "self.preemption_mode(seq)"],
        PreemptResetsBeforePublish: ["blocks in the prefix cache afterwards", "after num_computed was reset to 0",
                                     "publish first, then release, then reset"],
        PreemptPublishesSwap: ["preempt by swap", "a swap does not publish"],
    },
    ch07.check_admit: {
        AdmitWithoutReserving: ["positions with reserved room", "admission without reserving", "cache.reserve"],
        AdmitWithoutRoomCheck: ["margin 2 blocks", "expected 0", "margin()"],
        AdmitCountsCachedTokens: ["first 12 tokens are cached", "len(seq.tokens) - reused"],
        AdmitCountsPrefixHit: ["self.prefix_stats after admit", "counted twice"],
        AdmitCountsFutureOutput: ["max_tokens=16", "counted the output the sequence may still generate",
                                  "len(seq.tokens) - reused"],
    },
    ch07.check_choose_victim: {OldestVictim: ["picked id", "oldest request was preempted"],
                               VictimById: ["admission order", "expected 1, got 4", "largest seq_id"]},
    ch07.check_reserve_or_preempt: {
        PreemptNeverFrees: ["still holds", "blocks were never freed"],
        OldestVictim: ["oldest request was preempted"],
        TrueAfterEvicting: ["returned True; positions with reserved room", "try the reserve again"],
    },
    ch07.check_swap: {
        SwapInWrongOrder: ["saved from logical block 0", "wrong order"],
        SwapInValuesFromKeys: ["saved from logical block 0", "got no block", "K and V of each saved block"],
        SwapOutKeepsBlocks: ["after swap_out(0)", "release every block"],
        SwapInKeepsSavedCopy: ["still in cache.swapped", "del self.swapped[seq]"],
        SwapInWithoutKeyError: ["expected KeyError", "not swapped out"],
        SwapInForgetsLength: ["self.lengths[0]", "has no length", "self.lengths[seq] = saved.length"],
        SwapInLengthIsCapacity: ["self.lengths[0]", "expected 11, got 12", "capacity of its blocks"],
    },
    ch07.check_parallel_sampling: {
        ForkStartsFromZero: ["num_computed", "child.num_computed = seq.num_computed"],
        ForkSharesSeed: ["compared with a solo run with seed 101", "it drew what seed 100 draws",
                         "request.seed + i"],
        ForkAliasesTokens: ["the parent's list itself", "list(seq.tokens)"],
    },
}), ids=by_name)
def test_bug_is_caught(check, bug, words):
    fails_with(check, bug, words)


def test_admit_and_preempt_are_checked_the_same_where_the_grader_runs_them():
    """make grade holds the learner's scheduler class in another process: the recorded publish, the
    statistics and the room counts read the same there."""
    with hosted(right=Scheduler, twice=AdmitCountsPrefixHit, output=AdmitCountsFutureOutput,
                reset=PreemptResetsBeforePublish, swap=PreemptPublishesSwap) as remote:
        passes(ch07.check_admit, remote["right"])
        passes(ch07.check_preempt, remote["right"])
        fails_with(ch07.check_admit, remote["twice"], ["counted twice"])
        fails_with(ch07.check_admit, remote["output"], ["counted the output the sequence may still generate"])
        fails_with(ch07.check_preempt, remote["reset"], ["after num_computed was reset to 0"])
        fails_with(ch07.check_preempt, remote["swap"], ["a swap does not publish"])


@pytest.mark.parametrize("check, bug", [
    (ch07.check_admit, AdmitCountsPrefixHit), (ch07.check_admit, AdmitCountsFutureOutput),
    (ch07.check_preempt, PreemptResetsBeforePublish), (ch07.check_preempt, PreemptPublishesSwap),
], ids=by_name)
def test_bug_costs_only_its_own_exercise(check, bug):
    """Each of these bugs fails its exercise's check and no other scheduler check."""
    fails(check, bug)
    for other in SCHEDULER_CHECKS:
        if other is not check:
            passes(other, bug)


@pytest.mark.parametrize("scheduler, cache, words", [
    (PreemptNeverFrees, PagedKVCache, ["blocks were never freed"]),
    (PreemptNeverRequeues, PagedKVCache, ["its output against a solo run", "check_preempt fails on your scheduler too",
                                          "put it at the FRONT of self.waiting"]),
    (AdmitWithoutReserving, PagedKVCache, ["admission without reserving", "out of blocks mid-step"]),
    (Scheduler, SwapInWrongOrder, ["from-scratch run", "wrong order"]),
    (Scheduler, SwapInForgetsLength, ["crashed with KeyError", "check_swap fails", "has no length",
                                      "self.lengths[seq] = saved.length"]),
    (Scheduler, SwapInLengthIsCapacity, ["check_swap fails", "capacity of its blocks"]),
    (OldestVictim, PagedKVCache, ["the ones preempted", "expected [4], got [1]", "oldest request was preempted"]),
    (AdmitCountsFutureOutput, PagedKVCache, ["preemptions by mode", "check_admit fails on your scheduler too",
                                             "counted the output the sequence may still generate"]),
], ids=by_name)
def test_bug_fails_serving_under_pressure(scheduler, cache, words):
    message = fails_with(serving(scheduler, cache), None, words)
    assert "admission without reserving" not in message or scheduler is AdmitWithoutReserving


@pytest.mark.parametrize("bug", [RecomputeNotReset, PreemptNeverRequeues, OldestVictim, PreemptNeverFrees,
                                 AdmitWithoutRoomCheck,
                                 ForkSharesSeed, AdmitCountsCachedTokens, TrueAfterEvicting, ModeFromConfig,
                                 ForkStartsFromZero], ids=by_name)
def test_scheduler_bugs_fail_only_their_exercise(bug):
    """A bug in one exercise leaves the checks of the others passing."""
    exercise = {RecomputeNotReset: {"check_preempt"}, PreemptNeverRequeues: {"check_preempt"},
                PreemptNeverFrees: {"check_preempt", "check_reserve_or_preempt"},
                OldestVictim: {"check_choose_victim", "check_reserve_or_preempt"},
                AdmitWithoutRoomCheck: {"check_admit"}, ForkSharesSeed: {"check_parallel_sampling"},
                AdmitCountsCachedTokens: {"check_admit"}, TrueAfterEvicting: {"check_reserve_or_preempt"},
                ModeFromConfig: {"check_preempt"}, ForkStartsFromZero: {"check_parallel_sampling"}}[bug]
    for check in SCHEDULER_CHECKS:
        if check.__name__ in exercise:
            fails(check, bug)
        else:
            passes(check, bug)


# ---- review questions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("check, right, wrong, words", [
    (ch07.check_review_margin, 21, 20, "round the watermark up"),
    (ch07.check_review_margin, 21, 2, "watermark"),
    (ch07.check_review_victim, "b", "a", "newest first"),
    (ch07.check_review_victim, "(B)", "c", "recomputes it"),
    (ch07.check_review_swap_ms, 131.072, 65.5, "twice"),
    (ch07.check_review_swap_ms, 131, 0.131, "milliseconds"),
])
def test_review_questions(check, right, wrong, words):
    passes(check, right)
    fails_with(check, wrong, [words])
    fails_with(check, None, ["not answered yet"])


# ---- honest styles: each check drives the learner's scheduler classes put together as one ---------------

class AdmitBySuper(Scheduler):
    """Exercise 7.1 with zero-argument super()."""

    def admit(self, seq, budget):
        return super().admit(seq, budget)


class PreemptChained(AdmitBySuper):
    """Exercise 7.2 chained on the learner's Admission (class Scheduler(Scheduler))."""

    def preempt(self, seq):
        return super().preempt(seq)


class SamplingOwn(Scheduler):
    """Exercise 7.4 on the engine's Scheduler, as its cell starts."""


def test_each_exercise_is_checked_on_the_learners_schedulers_together():
    passes(ch07.check_preempt, PreemptChained, AdmitBySuper)
    passes(ch07.check_parallel_sampling, SamplingOwn, PreemptChained, AdmitBySuper)
    made = ch07.your_scheduler(SamplingOwn, PreemptChained, AdmitBySuper)
    assert made.__mro__[1:4] == (SamplingOwn, PreemptChained, AdmitBySuper)
    passes(ch07.check_serving_under_pressure, (SamplingOwn, PreemptChained, AdmitBySuper), PagedKVCache)


@pytest.mark.slow
def test_honest_styles_score_full_marks_through_the_grader():
    """Through make grade's sealed grader (the classes in the host, on its stubbed engine): admit and preempt
    calling the engine's helpers through zero-argument super(); parallel sampling, whose check runs them,
    keeps its points, and so does every other exercise."""
    from fixtures.course_support import REPO, assert_full_marks, expanded, with_cell_edited
    chapter = REPO / "solutions" / "ch07_continuous_batching.py"
    notebook = with_cell_edited(expanded(chapter), "ch07_admit", lambda source: source.replace(
        "        if not self.make_room(need):", "        if not super().make_room(need):"))
    notebook = with_cell_edited(notebook, "ch07_preempt", lambda source: source.replace(
        "            self.release(seq)\n", "            super().release(seq)\n"))
    assert_full_marks(notebook, chapter, "ch07")


# ---- the milestone writes text: the trained model served by the learner's scheduler and cache -----------

@pytest.mark.parametrize("scheduler, cache", [(PreemptNeverRequeues, PagedKVCache),
                                              (Scheduler, SwapInValuesFromKeys)],
                         ids=lambda value: value.__name__)
def test_the_milestone_writes_the_divergence_out_as_text(scheduler, cache):
    """A recompute victim never queued again stops writing; a swap that brings back keys as values writes
    other words: the message shows both sentences and the token where they part. (Both bugs wreck what
    the model reads, so they part whatever the trained weights; a milder bug, such as blocks swapped in
    the wrong order, may leave this small model's greedy text unchanged.)"""
    text = ch07.continuations.side_by_side(ch07.served_text(scheduler, cache))
    assert text.parted_at is not None and text.scratch != text.cached
    message = fails_with(serving(scheduler, cache), None, ["The trained tiny model writes it out: from-scratch: ",
                                                           ", yours: ", f", token {text.parted_at}"])
    assert str(text) in message


def test_the_engine_serves_the_recompute_s_sentence_under_pressure():
    text = ch07.continuations.side_by_side(ch07.served_text(Scheduler, PagedKVCache))
    assert text.parted_at is None and str(text).startswith("from-scratch and yours both write 'The block table")


def test_a_passing_milestone_writes_no_text(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("continuations computed for a passing check")
    monkeypatch.setattr(ch07.continuations, "shown", never)
    passes(ch07.check_serving_under_pressure, Scheduler, PagedKVCache)


# ---- the swap part of check_preempt runs the notebook's own swap, where it is written ---------------------

def test_preempting_by_swap_runs_the_notebook_s_own_swap(monkeypatch):
    """In the grader's host the engine's swap_out is Exercise 7.3's to write, so a cache the check built of
    the engine's own class could not swap there (the part was always 'not checked yet'): the notebook's
    PagedKVCache, when its swap_out and swap_in are written, is the cache preemption by swap runs on."""
    swapped = []

    class Swapping(PagedKVCache):
        def swap_out(self, seq):
            swapped.append(seq)
            return super().swap_out(seq)

        def swap_in(self, seq):
            return super().swap_in(seq)
    monkeypatch.setattr(sys.modules["__main__"], "PagedKVCache", Swapping, raising=False)
    passes(ch07.check_preempt, Scheduler)
    assert swapped
    swapped.clear()
    monkeypatch.setattr(sys.modules["__main__"], "PagedKVCache", PagedKVCache)     # the engine's: none of the learner's
    passes(ch07.check_preempt, Scheduler)
    assert not swapped


def test_a_swap_branch_bug_in_preempt_loses_exercise_7_2_through_the_grader():
    """Through make grade's sealed grader, where the engine's swap_out is the learner's to write: preempt's
    swap branch that publishes the victim is caught by check_preempt's swap part (which used to be always
    'not checked yet' there), and costs Exercise 7.2 only."""
    from fixtures.course_support import BUILD, REPO, expanded, grade_json, possible, scores, with_cell_edited, \
        write_notebook
    chapter = REPO / "solutions" / "ch07_continuous_batching.py"
    notebook = with_cell_edited(expanded(chapter), "ch07_preempt", lambda source: source.replace(
        "            self.release(seq, swap=True)",
        "            self.publish(seq)\n            self.release(seq, swap=True)"))
    folder = BUILD / "styles" / "ch07-swap-publishes"
    write_notebook(notebook, folder, chapter.stem)
    report = grade_json(folder, REPO / "solutions")
    lost = {key for key, points in possible(report).items() if scores(report)[key] != points}
    assert lost == {("ch07_continuous_batching", "ch07_test_preempt")}, lost
