"""The chapter-1 checks pass on the engine's reference, say "not implemented yet" on stubs, and name
each classic bug with its own hint."""
import pytest
import torch

from engine.cache.protocol import new_lengths
from engine.cache.static import StaticKVCache
from engine.checks import CheckFailed, ch01
from engine.config import kv_bytes_per_token
from fixtures.check_support import by_name, cases, fails, fails_with, mutant, passes, stub


def stub_function(*args, **kwargs):
    raise NotImplementedError()


StubCache = stub(StaticKVCache, "update", name="StubCache")


def static_utilization(lengths, capacity):
    return sum(lengths) / (len(lengths) * capacity)


def slots_that_fit(gpu_bytes, weight_bytes, slot_tokens, bytes_per_token):
    return max(gpu_bytes - weight_bytes, 0) // (slot_tokens * bytes_per_token)


FUNCTION_CHECKS = [
    (ch01.check_kv_bytes_per_token, kv_bytes_per_token),
    (ch01.check_static_utilization, static_utilization),
    (ch01.check_slots_that_fit, slots_that_fit),
]
CACHE_CHECKS = [ch01.check_static_update, ch01.check_static_cache_in_engine]


# ---- the reference passes -------------------------------------------------------------------------

@pytest.mark.parametrize("check, fn", FUNCTION_CHECKS, ids=by_name)
def test_reference_functions_pass(check, fn):
    passes(check, fn)


@pytest.mark.parametrize("check", CACHE_CHECKS, ids=by_name)
def test_reference_cache_passes(check, one_thread):
    passes(check, StaticKVCache)


def test_the_shipped_models_cost_what_the_chapter_says():
    out = passes(ch01.check_kv_bytes_per_token, kv_bytes_per_token)
    for words in ("llama-2-13b 819,200", "llama-3-8b 131,072", "llama-3-70b 327,680", "qwen3-0.6b 114,688"):
        assert words in out, out


def test_the_hidden_engine_run_passes(one_thread):
    passes(ch01.check_static_cache_in_engine, StaticKVCache, bs=2, decode_steps=24, seed=3)


def test_review_answers_pass():
    passes(ch01.check_review_recompute, 6225)
    passes(ch01.check_review_kv_heads, "b")


# ---- stubs are "not implemented yet" ---------------------------------------------------------------

STUBS = [(check, stub_function, "stub_function") for check, _ in FUNCTION_CHECKS] + [
    (check, StubCache, "StubCache.update") for check in CACHE_CHECKS]


@pytest.mark.parametrize("check, unwritten, where", STUBS, ids=by_name)
def test_stub_is_not_implemented(check, unwritten, where):
    fails_with(check, unwritten, [where, "not implemented yet"])


@pytest.mark.parametrize("check", [ch01.check_review_recompute, ch01.check_review_kv_heads], ids=by_name)
def test_unanswered_review_question(check):
    assert "not answered yet" in fails(check, None)


# ---- planted bugs: bytes per token -----------------------------------------------------------------

def kv_once(config, dtype_bytes):
    return config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes


def kv_query_heads(config, dtype_bytes):
    return 2 * config.num_layers * config.num_heads * config.head_dim * dtype_bytes


def kv_hidden(config, dtype_bytes):
    return 2 * config.num_layers * config.hidden_size * dtype_bytes


def kv_no_layers(config, dtype_bytes):
    return 2 * config.num_kv_heads * config.head_dim * dtype_bytes


def kv_fp32_always(config, dtype_bytes):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4


def kv_fp16_always(config, dtype_bytes):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2


def kv_bits(config, dtype_bytes):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes * 8


@pytest.mark.parametrize("bug, words", [
    (kv_once, ["expected 819200, got 409600", "K and V counted once"]),
    (kv_query_heads, ["num_heads (query heads) used instead of num_kv_heads"]),
    (kv_hidden, ["hidden_size used"]),
    (kv_no_layers, ["the layers were left out"]),
    (kv_fp32_always, ["always counts 4 byte(s)", "dtype_bytes"]),
    (kv_fp16_always, ["dtype_bytes=1", "always counts 2 byte(s)"]),
    (kv_bits, ["counts bits"]),
], ids=by_name)
def test_kv_bytes_bug_is_caught(bug, words):
    fails_with(ch01.check_kv_bytes_per_token, bug, words)


def kv_float(config, dtype_bytes):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes / 1


def test_kv_bytes_must_be_an_int():
    fails_with(ch01.check_kv_bytes_per_token, kv_float, ["expected the int 819200, got 819200.0", "not an int"])


def test_each_kv_bug_gets_a_different_hint():
    hints = {fails(ch01.check_kv_bytes_per_token, bug).split("Hint: ")[1]
             for bug in (kv_once, kv_query_heads, kv_hidden, kv_no_layers, kv_fp32_always, kv_bits)}
    assert len(hints) == 6


# ---- planted bugs: the static cache's update -------------------------------------------------------

# Writes every column, padding included: position -1 lands in the slot's last position.
PaddingWritten = mutant(StaticKVCache, "update", """
-    valid = positions >= 0
+    valid = positions >= -1
""", name="PaddingWritten")


class PaddingClamped(StaticKVCache):
    """Clamps padding to position 0 instead of skipping it: overwrites each short row's first token."""

    def update(self, layer, k, v, positions):
        return super().update(layer, k, v, positions.clamp(min=0))


class RowZeroOffset(StaticKVCache):
    """Writes every row starting at row 0's first position (a ragged batch treated as aligned)."""

    def update(self, layer, k, v, positions):
        start = int(positions[0, 0])
        counts = (positions >= 0).sum(dim=1)
        shifted = torch.full_like(positions, -1)
        for b, n in enumerate(counts.tolist()):
            shifted[b, :n] = torch.arange(start, start + n)
        keys, values, _ = super().update(layer, k, v, shifted)
        lengths = new_lengths(positions, [self.lengths[s] for s in self.batch])
        return keys, values, torch.tensor(lengths)


class ColumnOffset(StaticKVCache):
    """Writes column t at position t, whatever the row's start."""

    def update(self, layer, k, v, positions):
        columns = torch.arange(positions.shape[1]).expand_as(positions)
        super().update(layer, k, v, torch.where(positions >= 0, columns, -1))
        rows = torch.tensor([self.slot[s] for s in self.batch])
        lengths = new_lengths(positions, [self.lengths[s] for s in self.batch])
        if layer == len(self.k) - 1:
            self.lengths.update(zip(self.batch, lengths))
        span = max(lengths)
        return self.k[layer][rows, :, :span], self.v[layer][rows, :, :span], torch.tensor(lengths)


class BatchRowAsSlot(StaticKVCache):
    """Uses the batch row as the slot row."""

    def update(self, layer, k, v, positions):
        slot = self.slot
        self.slot = {s: b for b, s in enumerate(self.batch)}
        try:
            return super().update(layer, k, v, positions)
        finally:
            self.slot = slot


class KvLensOneShort(StaticKVCache):
    """kv_lens (and the committed length) = highest position, not highest position + 1."""

    def update(self, layer, k, v, positions):
        keys, values, kv_lens = super().update(layer, k, v, positions)
        if layer == len(self.k) - 1:
            for s, n in zip(self.batch, kv_lens.tolist()):
                self.lengths[s] = n - 1
        return keys, values, kv_lens - 1


class CommitsEveryLayer(StaticKVCache):
    """Commits the new lengths on every layer's call."""

    def update(self, layer, k, v, positions):
        keys, values, kv_lens = super().update(layer, k, v, positions)
        self.lengths.update(zip(self.batch, kv_lens.tolist()))
        return keys, values, kv_lens


class CountsNewTokens(StaticKVCache):
    """Length = old length + new tokens, committed on every layer: later layers count twice."""

    def update(self, layer, k, v, positions):
        super().update(layer, k, v, positions)
        lengths = [self.lengths[s] + int(n) for s, n in zip(self.batch, (positions >= 0).sum(1))]
        self.lengths.update(zip(self.batch, lengths))
        rows = torch.tensor([self.slot[s] for s in self.batch])
        span = max(lengths)
        return self.k[layer][rows, :, :span], self.v[layer][rows, :, :span], torch.tensor(lengths)


class LensFromPositionsOnly(StaticKVCache):
    """kv_lens = highest position + 1, forgetting the old length: an all-padding row drops to 0."""

    def update(self, layer, k, v, positions):
        keys, values, _ = super().update(layer, k, v, positions)
        lengths = (positions.max(dim=1).values + 1).tolist()
        if layer == len(self.k) - 1:
            self.lengths.update(zip(self.batch, lengths))
        return keys, values, torch.tensor(lengths)


class FloatLens(StaticKVCache):
    """Right lengths, but kv_lens as a float tensor."""

    def update(self, layer, k, v, positions):
        keys, values, kv_lens = super().update(layer, k, v, positions)
        return keys, values, kv_lens.float()


# Returns the whole slots, not cut to the longest new length.
WholeSlots = mutant(StaticKVCache, "update", """
-    return self.k[layer][rows, :, :span], self.v[layer][rows, :, :span], kv_lens
+    return self.k[layer][rows], self.v[layer][rows], kv_lens
""", name="WholeSlots")


class ValuesFromKeys(StaticKVCache):
    """Stores k in the value cache too."""

    def update(self, layer, k, v, positions):
        return super().update(layer, k, k, positions)


# Commits the new lengths on layer 0's call instead of the last layer's.
CommitsOnFirstLayer = mutant(StaticKVCache, "update", """
-    if layer == len(self.k) - 1:
+    if layer == 0:
""", name="CommitsOnFirstLayer")


@pytest.mark.parametrize("bug, words", [
    (PaddingWritten, ["padding written", "holds a padding token's key", "index -1 is the LAST"]),
    (PaddingClamped, ["padding written", "landed at position 0", "instead of being skipped"]),
    (RowZeroOffset, ["ragged rows written at the wrong offset", "landed at position 5",
                     "starts at its own position"]),
    (ColumnOffset, ["ragged rows written at the wrong offset", "its column, instead of its position"]),
    (BatchRowAsSlot, ["a batch row is not a slot row", "self.slot[12]"]),
    (KvLensOneShort, ["kv_lens", "expected [5, 2, 3], got [4, 1, 2]", "off by one (one short)"]),
    (CommitsEveryLayer, ["length committed on every layer", "update(layer=0) of 2"]),
    (CountsNewTokens, ["length committed on every layer"]),
    (CommitsOnFirstLayer, ["or on one before the last", "update(layer=0) is not the last"]),
    (LensFromPositionsOnly, ["sequence 11: no new token", "expected [6, 5, 3], got [6, 5, 0]",
                             "all padding", "never less than before"]),
    (FloatLens, ["the type of kv_lens", "torch.long"]),
    (WholeSlots, ["expected [3, 2, 5, 4], got [3, 2, 10, 4]", "cut the slots to the longest"]),
    (ValuesFromKeys, ["the returned values", "the values are the keys"]),
], ids=by_name)
def test_update_bug_is_caught_directly(bug, words):
    fails_with(ch01.check_static_update, bug, words)


@pytest.mark.parametrize("bug, hint", [
    (PaddingClamped, "padding written"), (RowZeroOffset, "wrong offset"), (ColumnOffset, "wrong offset"),
    (BatchRowAsSlot, "a batch row is not a slot row"), (KvLensOneShort, "off by one"),
    (CountsNewTokens, "length committed on every layer"),
], ids=by_name)
def test_update_bug_breaks_the_logits_with_its_hint(bug, hint, one_thread):
    fails_with(ch01.check_static_cache_in_engine, bug, ["from-scratch run", hint])


@pytest.mark.parametrize("bug", [PaddingWritten, CommitsEveryLayer], ids=by_name)
def test_bugs_the_logits_cannot_see_still_fail_the_direct_check(bug, one_thread):
    # Padding written to the last slot position is overwritten before it is read, and committing an
    # idempotent max() early changes nothing a layer reads: only the direct check can see these.
    fails(ch01.check_static_update, bug)
    try:
        ch01.check_static_cache_in_engine(bug)
    except CheckFailed as exc:
        assert "Hint:" in str(exc)


# ---- planted bugs: the fragmentation tax -----------------------------------------------------------

@pytest.mark.parametrize("bug, words", [
    (lambda l, c: 100 * sum(l) / (len(l) * c), ["a percentage"]),
    (lambda l, c: 1 - sum(l) / (len(l) * c), ["the unused share"]),
    (lambda l, c: sum(l) / (len(l) * max(l)), ["divides by the longest request"]),
    (lambda l, c: sum(l) / c, ["reserves one slot in total"]),
], ids=["percent", "waste", "longest", "one_slot"])
def test_utilization_bug_is_caught(bug, words):
    fails_with(ch01.check_static_utilization, bug, ["expected 657/3072 = 0.2139", *words])


@pytest.mark.parametrize("bug, words", [
    (lambda g, w, s, b: -(-(g - w) // (s * b)) if g > w else 0, ["rounded up"]),
    (lambda g, w, s, b: g // (s * b), ["the weights were not subtracted"]),
    (lambda g, w, s, b: max(g - w, 0) // b, ["counts tokens, not slots"]),
    (lambda g, w, s, b: max(g - w, 0) / (s * b), ["round down to whole slots"]),
    (lambda g, w, s, b: (g - w) // (s * b), ["return 0, not a negative count"]),
    (lambda g, w, s, b: float(max(g - w, 0) // (s * b)), ["as an int"]),
], ids=["ceil", "no_weights", "tokens", "fraction", "negative", "float"])
def test_slots_bug_is_caught(bug, words):
    fails_with(ch01.check_slots_that_fit, bug, words)


# ---- review questions ------------------------------------------------------------------------------

@pytest.mark.parametrize("check, answer, words", cases({
    ch01.check_review_recompute: {149: ["WITH a cache"], 6375: ["one step off"], 6275: ["one step off"],
                                  5000: ["add those up"]},
    ch01.check_review_kv_heads: {"a": ["query heads are not cached"], "c": ["vocabulary"], "d": ["context"],
                                 "e": ["one letter"]},
}))
def test_review_wrong_answers(check, answer, words):
    assert "6225" not in fails_with(check, answer, words)   # the hint never gives the answer away
