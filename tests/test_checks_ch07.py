"""The chapter-7 checks pass on the engine's scheduler and cache, fail on stubs, and fail on the
chapter's classic bugs, each with its own hint."""
import pytest

from engine.cache.paged import PagedKVCache
from engine.checks import ch07
from engine.serve.request import Status
from engine.serve.scheduler import Scheduler
from fixtures.check_support import fails

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEDULER_CHECKS = [ch07.check_admit, ch07.check_choose_victim, ch07.check_preempt,
                    ch07.check_reserve_or_preempt, ch07.check_parallel_sampling]


def serving(sched_cls=Scheduler, cache_cls=PagedKVCache):
    return lambda _: ch07.check_serving_under_pressure(sched_cls, cache_cls)


@pytest.mark.parametrize("check", SCHEDULER_CHECKS, ids=lambda c: c.__name__)
def test_reference_scheduler_passes(check, capsys):
    check(Scheduler)
    assert capsys.readouterr().out.startswith("✓")


def test_reference_swap_passes(capsys):
    ch07.check_swap(PagedKVCache)
    ch07.check_swap(PagedKVCache, block_size=2)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("block_size, seed", [(4, 0), (2, 1)])
def test_reference_serving_passes(block_size, seed, capsys):
    ch07.check_serving_under_pressure(Scheduler, PagedKVCache, block_size=block_size, seed=seed)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "recompute" in out and "swap" in out


# ---- stubs ----------------------------------------------------------------------------------------

class StubScheduler(Scheduler):
    def admit(self, seq, budget):
        raise NotImplementedError()

    def reserve_or_preempt(self, seq, count, scheduled):
        raise NotImplementedError()

    def choose_victim(self, scheduled):
        raise NotImplementedError()

    def preempt(self, seq):
        raise NotImplementedError()

    def fork_samples(self, seq, new_ids):
        raise NotImplementedError()


class StubCache(PagedKVCache):
    def swap_out(self, seq):
        raise NotImplementedError()

    def swap_in(self, seq):
        raise NotImplementedError()


@pytest.mark.parametrize("check", SCHEDULER_CHECKS, ids=lambda c: c.__name__)
def test_stub_scheduler_is_not_implemented(check):
    assert "not implemented yet" in fails(check, StubScheduler)


def test_stub_cache_is_not_implemented():
    assert "not implemented yet" in fails(ch07.check_swap, StubCache)
    assert "not implemented yet" in fails(serving(StubScheduler, StubCache), None)


# ---- planted bugs -----------------------------------------------------------------------------------

class PreemptNeverFrees(Scheduler):
    """A recomputed victim goes back to the queue still holding its blocks."""

    def preempt(self, seq):
        mode = self.preemption_mode(seq)
        self.running.remove(seq)
        seq.preemptions += 1
        self.preemptions[mode] += 1
        if mode == "swap":
            self.release(seq, swap=True)
            self.swapped_tokens += seq.num_computed
            seq.status = Status.SWAPPED
            self.swapped.append(seq)
        else:
            seq.num_computed = 0
            seq.status = Status.WAITING
            self.waiting.appendleft(seq)
        return mode


class ModeFromConfig(Scheduler):
    """preempt takes the mode from the config, so "auto" is never resolved."""

    def preempt(self, seq):
        self.preemption_mode = lambda victim: self.config.preemption
        return super().preempt(seq)


class RecomputeNotReset(Scheduler):
    """A recomputed victim keeps its num_computed, as if its K/V were still there."""

    def preempt(self, seq):
        computed = seq.num_computed
        mode = super().preempt(seq)
        if mode == "recompute":
            seq.num_computed = computed
        return mode


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


class AdmitCountsCachedTokens(Scheduler):
    """Asks room for the whole prompt, the blocks attach already shared included."""

    def admit(self, seq, budget):
        reused = self.attach(seq)
        need = self.cache.blocks_wanted(seq.seq_id, len(seq.tokens)) + self.margin()
        if not self.make_room(need):
            self.detach(seq)
            return 0
        seq.num_computed = seq.cached_tokens = reused
        count = min(seq.num_pending, budget)
        self.cache.reserve(seq.seq_id, count)
        seq.status = Status.RUNNING
        self.running.append(seq)
        return count


class TrueAfterEvicting(Scheduler):
    """Returns True as soon as eviction freed something, without reserving again."""

    def reserve_or_preempt(self, seq, count, scheduled):
        while True:
            try:
                self.cache.reserve(seq.seq_id, count)
                return True
            except MemoryError:
                if self.evict_for(seq, count):
                    return True
                victim = self.choose_victim(scheduled)
                self.preempt(victim)
                if victim is seq:
                    return False


class OldestVictim(Scheduler):
    def choose_victim(self, scheduled):
        return next(s for s in self.running if s.seq_id not in scheduled)


class SwapInWrongOrder(PagedKVCache):
    """Restores the saved blocks into the new blocks, then lists the new blocks backwards."""

    def swap_in(self, seq):
        moved = super().swap_in(seq)
        self.tables[seq].reverse()
        return moved


class SwapOutKeepsBlocks(PagedKVCache):
    def swap_out(self, seq):
        table = list(self.tables[seq])
        for block in table:
            self.allocator.share(block)
        return super().swap_out(seq)


class SwapInKeepsSavedCopy(PagedKVCache):
    """Restores the blocks but leaves the sequence listed as swapped out."""

    def swap_in(self, seq):
        saved = self.swapped[seq]
        moved = super().swap_in(seq)
        self.swapped[seq] = saved
        return moved


class SwapInWithoutKeyError(PagedKVCache):
    """Returns 0 for a sequence that is not swapped out instead of raising."""

    def swap_in(self, seq):
        return super().swap_in(seq) if seq in self.swapped else 0


class ForkStartsFromZero(Scheduler):
    """Children forget that the prompt is already in the shared blocks."""

    def fork_samples(self, seq, new_ids):
        children = super().fork_samples(seq, new_ids)
        for child in children:
            child.num_computed = 0
        return children


class ForkSharesSeed(Scheduler):
    """Every sample draws with the request's own seed."""

    def fork_samples(self, seq, new_ids):
        children = super().fork_samples(seq, new_ids)
        for child in children:
            child.generator.manual_seed(seq.request.seed)
        return children


class ForkAliasesTokens(Scheduler):
    def fork_samples(self, seq, new_ids):
        children = super().fork_samples(seq, new_ids)
        for child in children:
            child.tokens = seq.tokens
        return children


@pytest.mark.parametrize("check, bug, words", [
    (ch07.check_preempt, PreemptNeverFrees, ["blocks were never freed", "expected (False,"]),
    (serving(PreemptNeverFrees), None, ["blocks were never freed"]),
    (ch07.check_reserve_or_preempt, PreemptNeverFrees, ["still holds", "blocks were never freed"]),
    (ch07.check_preempt, RecomputeNotReset, ["num_computed of the victim", "not reset to re-prefill"]),
    (ch07.check_preempt, ModeFromConfig, ["preemption='auto'", "self.preemption_mode(seq)"]),
    (ch07.check_admit, AdmitWithoutReserving, ["positions with reserved room", "admission without reserving",
                                               "cache.reserve"]),
    (serving(AdmitWithoutReserving), None, ["admission without reserving", "out of blocks mid-step"]),
    (ch07.check_admit, AdmitWithoutRoomCheck, ["margin 2 blocks", "expected 0", "margin()"]),
    (ch07.check_admit, AdmitCountsCachedTokens, ["first 12 tokens are cached", "len(seq.tokens) - reused"]),
    (ch07.check_choose_victim, OldestVictim, ["picked id", "oldest request was preempted"]),
    (ch07.check_reserve_or_preempt, OldestVictim, ["oldest request was preempted"]),
    (ch07.check_reserve_or_preempt, TrueAfterEvicting, ["returned True; positions with reserved room",
                                                        "try the reserve again"]),
    (ch07.check_swap, SwapInWrongOrder, ["saved from logical block 0", "wrong order"]),
    (serving(Scheduler, SwapInWrongOrder), None, ["from-scratch run", "wrong order"]),
    (ch07.check_swap, SwapOutKeepsBlocks, ["after swap_out(0)", "release every block"]),
    (ch07.check_swap, SwapInKeepsSavedCopy, ["still in cache.swapped", "del self.swapped[seq]"]),
    (ch07.check_swap, SwapInWithoutKeyError, ["expected KeyError", "not swapped out"]),
    (ch07.check_parallel_sampling, ForkStartsFromZero, ["num_computed", "child.num_computed = seq.num_computed"]),
    (ch07.check_parallel_sampling, ForkSharesSeed, ["compared with a solo run with seed 101",
                                                    "it drew what seed 100 draws", "request.seed + i"]),
    (ch07.check_parallel_sampling, ForkAliasesTokens, ["the parent's list itself", "list(seq.tokens)"]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_bug_is_caught(check, bug, words):
    message = fails(check, bug)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("bug", [RecomputeNotReset, OldestVictim, PreemptNeverFrees, AdmitWithoutRoomCheck,
                                 ForkSharesSeed, AdmitCountsCachedTokens, TrueAfterEvicting, ModeFromConfig,
                                 ForkStartsFromZero], ids=lambda b: b.__name__)
def test_scheduler_bugs_fail_only_their_exercise(bug):
    """A bug in one exercise leaves the checks of the others passing."""
    exercise = {RecomputeNotReset: {"check_preempt"},
                PreemptNeverFrees: {"check_preempt", "check_reserve_or_preempt"},
                OldestVictim: {"check_choose_victim", "check_reserve_or_preempt"},
                AdmitWithoutRoomCheck: {"check_admit"}, ForkSharesSeed: {"check_parallel_sampling"},
                AdmitCountsCachedTokens: {"check_admit"}, TrueAfterEvicting: {"check_reserve_or_preempt"},
                ModeFromConfig: {"check_preempt"}, ForkStartsFromZero: {"check_parallel_sampling"}}[bug]
    for check in SCHEDULER_CHECKS:
        if check.__name__ in exercise:
            fails(check, bug)
        else:
            check(bug)


# ---- review questions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("check, right, wrong, words", [
    (ch07.check_review_margin, 21, 20, "round the watermark up"),
    (ch07.check_review_margin, 21, 2, "watermark"),
    (ch07.check_review_victim, "b", "a", "newest first"),
    (ch07.check_review_victim, "(B)", "c", "recomputes it"),
    (ch07.check_review_swap_ms, 131.072, 65.5, "twice"),
    (ch07.check_review_swap_ms, 131, 0.131, "milliseconds"),
])
def test_review_questions(check, right, wrong, words, capsys):
    check(right)
    assert capsys.readouterr().out.startswith("✓")
    assert words in fails(check, wrong)
    assert "not answered yet" in fails(check, None)
