"""The scheduler: each step, decide which sequences run and how many tokens each, under two budgets.

The token budget bounds the work of one forward pass (prefill chunks and decode tokens together). The
KV budget bounds memory: every token scheduled must have room reserved in the cache *before* any
compute. When a reservation fails the scheduler frees memory in order of cost: first prefix-cache
blocks nobody uses, then the newest running sequence, preempted by swap or by recompute.

`schedule()` is the step loop; each decision in it is a small method a subclass may override (chapter
7 has the learner write them): `admit` (let a waiting sequence in), `reserve_or_preempt`,
`choose_victim` and `preempt` (make room for a running one), `resume` (swap one back in) and
`fork_samples` (split a prefilled request into its n samples). What the cache can do (blocks, swap,
a region fixed up front) comes from its protocols in engine/cache/protocol.py, read once. The
prefix-cache side (attach, publish, evict) is the `PrefixSharing` mixin in prefix_sharing.py.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Iterator

from engine.cache.protocol import capabilities
from engine.blocks import ceil_div
from engine.serve.batch import Chunk, SchedulerConfig
from engine.serve.prefix_sharing import PrefixSharing
from engine.serve.request import RequestTooLarge, Sequence, Status, make_generator

__all__ = ["Chunk", "Scheduler", "SchedulerConfig"]


class Scheduler(PrefixSharing):
    """Owns the waiting, running and swapped queues and every reserve, free and preemption."""

    def __init__(self, cache, config: SchedulerConfig | None = None, prefix_cache=None):
        """`cache`: any protocol cache; `prefix_cache`: a PrefixCache over it, or None."""
        self.cache, self.config, self.prefix = cache, config or SchedulerConfig(), prefix_cache
        self.caps = capabilities(cache)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # admission order: the last one is the newest
        self.swapped: deque[Sequence] = deque()
        self.swapped_tokens = 0
        self.evictable = True          # False once evict() came up short; any release sets it again
        self.preemptions = {"recompute": 0, "swap": 0}
        self.prefix_stats = {"queries": 0, "hits": 0, "tokens_saved": 0}

    # ---- memory arithmetic -------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` positions."""
        return ceil_div(tokens, self.cache.block_size)

    def capacity_tokens(self) -> int:
        """The most KV positions one sequence could ever get: the whole pool (or the largest slot)."""
        return self.caps.max_request_tokens

    def check_fits(self, request_id: int, prompt_len: int, max_tokens: int) -> None:
        """Reject, before touching any state, a request that could not run even alone."""
        capacity = self.capacity_tokens()
        if prompt_len > capacity:
            raise RequestTooLarge(request_id, prompt_len, capacity, f"its prompt of {prompt_len} tokens")
        # The last sampled token is never written to the cache, hence the - 1.
        if prompt_len + max_tokens - 1 > capacity:
            raise RequestTooLarge(request_id, prompt_len + max_tokens - 1, capacity,
                                  f"a prompt of {prompt_len} plus up to {max_tokens} output tokens")

    def margin(self) -> int:
        """Free blocks to keep beyond a newcomer's prompt; none when nothing runs (it could wait forever)."""
        if not self.running:
            return 0
        pool = self.cache.allocator.num_blocks
        return max(self.config.margin_blocks, math.ceil(self.config.watermark * pool))

    # ---- one step ----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence for admission."""
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def schedule(self) -> list[Chunk]:
        """Pick this step's rows and reserve their KV room; nothing is computed yet."""
        budget = self.config.max_batched_tokens
        chunks: list[Chunk] = []
        scheduled: set[int] = set()
        preempted = False
        # 1. Running sequences, decodes first (one token each), then prefill or replay chunks.
        for decoding in (True, False):
            for seq in [s for s in self.running if (s.num_pending == 1) == decoding]:
                if budget == 0:
                    break
                if seq.status is not Status.RUNNING:            # preempted earlier in this loop
                    continue
                count = min(seq.num_pending, budget)
                if not self.reserve_or_preempt(seq, count, scheduled):
                    preempted = True
                    continue
                chunks.append(Chunk(seq, seq.num_computed, count))
                scheduled.add(seq.seq_id)
                budget -= count
        # 2. Swapped sequences come back before anyone new is let in (but not in a step that preempted).
        while not preempted and self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.swapped[0]
            if not self.resume(seq):
                break
            self.swapped.popleft()
            count = min(seq.num_pending, budget)
            try:
                self.cache.reserve(seq.seq_id, count)
            except MemoryError:
                continue                               # it stays running; next step will retry
            chunks.append(Chunk(seq, seq.num_computed, count))
            scheduled.add(seq.seq_id)
            budget -= count
        # 3. New (or recompute-preempted) sequences, oldest first, while the prompt fits with a margin.
        while (not preempted and not self.swapped and self.waiting and budget > 0
               and len(self.running) < self.config.max_num_seqs):
            seq = self.waiting[0]
            count = self.admit(seq, budget) if self.caps.paged else self.admit_slot(seq, budget)
            if not count:
                break
            self.waiting.popleft()
            self.count_prefix_hit(seq)
            chunks.append(Chunk(seq, seq.num_computed, count))
            scheduled.add(seq.seq_id)
            budget -= count
        return chunks

    # ---- admission ---------------------------------------------------------------------------
    def admit(self, seq: Sequence, budget: int) -> int:
        """Let waiting `seq` in if its prompt fits with the margin; reserve a chunk.

        Returns the tokens reserved for this step (at most `budget`); 0 when it cannot
        come in now, and then nothing has changed: no table, no refcount, same queues.
        """
        reused = self.attach(seq)      # in the cache now; `reused` tokens are cached
        # Count after attaching: shared blocks are no longer free to evict (the vLLM
        # trap); blocks_wanted counts the copy of a shared last block a write triggers.
        need = self.cache.blocks_wanted(seq.seq_id, len(seq.tokens) - reused)
        need += self.margin()
        if not self.make_room(need):
            self.detach(seq)                   # undo the attach: nothing changes
            return 0
        seq.num_computed = seq.cached_tokens = reused
        count = min(seq.num_pending, budget)
        self.cache.reserve(seq.seq_id, count)          # room before any compute
        seq.status = Status.RUNNING
        self.running.append(seq)
        return count

    def admit_slot(self, seq: Sequence, budget: int) -> int:
        """admit() for a slot or region cache: a free slot (sized up front if the cache says so) is room."""
        try:
            if self.caps.up_front:
                self.cache.create(seq.seq_id, max_length=seq.max_length)
            else:
                self.cache.create(seq.seq_id)
        except MemoryError:
            return 0                                   # no free slot: wait for a sequence to finish
        seq.num_computed = seq.cached_tokens = 0
        count = min(seq.num_pending, budget)
        try:
            self.cache.reserve(seq.seq_id, count)
        except MemoryError:
            self.cache.free(seq.seq_id)
            return 0
        seq.status = Status.RUNNING
        self.running.append(seq)
        return count

    def release(self, seq: Sequence, swap: bool = False) -> None:
        """Free (or swap out) a sequence's blocks; cached blocks it held may now be evictable."""
        if swap:
            self.cache.swap_out(seq.seq_id)
        else:
            self.cache.free(seq.seq_id)
        self.evictable = True

    # ---- preemption --------------------------------------------------------------------------
    def reserve_or_preempt(self, seq: Sequence, count: int, scheduled: set) -> bool:
        """Reserve `count` positions for running `seq`, freeing memory until that works.

        Out of memory: evict unused prefix-cache blocks first; when that frees
        nothing, preempt choose_victim(scheduled) and retry. False when the victim
        was `seq` itself.
        """
        while True:
            try:
                self.cache.reserve(seq.seq_id, count)
                return True
            except MemoryError:
                if self.evict_for(seq, count):
                    continue
                victim = self.choose_victim(scheduled)
                self.preempt(victim)
                if victim is seq:
                    return False

    def choose_victim(self, scheduled: set[int]) -> Sequence:
        """The running sequence to preempt: the newest not in `scheduled`."""
        return next(s for s in reversed(self.running) if s.seq_id not in scheduled)

    def preemption_mode(self, seq: Sequence) -> str:
        """Swap or recompute this victim? Swap moves its KV over PCIe twice; recompute reruns prefill.

        Recompute costs prefill FLOPs, which grow with length, and needs no host memory; swap costs
        bytes, also linear in length, but is cheap per token on a fast link. Short victims recompute.
        """
        mode = self.config.preemption
        can_swap = (self.caps.swappable and seq.num_computed > 0 and
                    self.swapped_tokens + seq.num_computed <= self.config.swap_space_tokens)
        if mode == "auto":
            mode = "swap" if seq.num_computed >= self.config.swap_min_tokens else "recompute"
        return "swap" if (mode == "swap" and can_swap) else "recompute"

    def preempt(self, seq: Sequence) -> str:
        """Take a running sequence's KV memory back; it resumes later where it stopped.

        Returns the mode used, "swap" or "recompute".
        """
        mode = self.preemption_mode(seq)
        self.running.remove(seq)
        seq.preemptions += 1
        self.preemptions[mode] += 1
        if mode == "swap":
            self.release(seq, swap=True)       # its K/V wait in host memory
            self.swapped_tokens += seq.num_computed
            seq.status = Status.SWAPPED
            self.swapped.append(seq)
        else:
            self.publish(seq)                  # its blocks may be cached on return
            self.release(seq)
            seq.num_computed = 0               # prompt and output are prefilled again
            seq.status = Status.WAITING
            self.waiting.appendleft(seq)       # newest go first: older end in front
        return mode

    def resume(self, seq: Sequence) -> bool:
        """Swap `seq` back in if its blocks plus the margin fit; False leaves it swapped out."""
        if not self.make_room(self.blocks_for(seq.num_computed + 1) + self.margin()):
            return False
        try:
            self.cache.swap_in(seq.seq_id)
        except MemoryError:
            return False
        self.swapped_tokens -= seq.num_computed
        seq.status = Status.RUNNING
        self.running.append(seq)
        return True

    # ---- forks and leaving -------------------------------------------------------------------
    def fork_samples(self, seq: Sequence, new_ids: Iterator[int]) -> list[Sequence]:
        """Split `seq`, its prompt just prefilled, into the request's n samples.

        Sample i (1..n-1) gets the id next(new_ids), a copy of the tokens, a generator
        seeded with request.seed + i, and every block of `seq` (cache.fork); it runs
        from the next step on. Returns the new sequences.
        """
        request = seq.request
        children = []
        for index in range(1, request.n):
            child = Sequence(next(new_ids), request, list(seq.tokens),
                             make_generator(request.seed + index), sample_index=index)
            request.sequences.append(child)
            self.cache.fork(seq.seq_id, child.seq_id)
            child.num_computed, child.status = seq.num_computed, Status.RUNNING
            self.running.append(child)
            children.append(child)
        return children

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence: publish its blocks to the prefix cache, then free them at once."""
        if seq.status is Status.RUNNING:
            self.publish(seq)
            self.running.remove(seq)
            self.release(seq)
        elif seq.status is Status.SWAPPED:
            self.swapped.remove(seq)
            self.swapped_tokens -= seq.num_computed
            self.release(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason

    def has_work(self) -> bool:
        """True while any sequence waits, runs, or sits swapped out."""
        return bool(self.waiting or self.running or self.swapped)
