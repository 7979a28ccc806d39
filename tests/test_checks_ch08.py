"""The chapter-8 checks pass on the engine's int8 cache and on a right byte count, fail on stubs, and fail
on each classic bug of quantize-on-write, dequantize-on-read, copy-on-write and the MLA byte math with a
hint that names that bug."""
import pytest
import torch

from engine.cache.paged import PagedKVCache
from engine.cache.quantized import QMAX, SCALE_FLOOR, QuantizedPagedKVCache
from engine.checks import ch08
from fixtures.check_support import by_name, cases, fails, fails_with, mutant, passes, stub

pytestmark = pytest.mark.usefixtures("one_thread")

CACHE_CHECKS = [ch08.check_quantize_on_write, ch08.check_dequantize_on_read, ch08.check_copy_on_write_carries_scales,
                ch08.check_sharing_keeps_scales, ch08.check_int8_logits]


@pytest.mark.parametrize("check", CACHE_CHECKS, ids=by_name)
def test_reference_passes(check):
    passes(check, QuantizedPagedKVCache)


StubCache = stub(QuantizedPagedKVCache, "quantize_into", "dequantize", "copy_on_write", name="StubCache")


@pytest.mark.parametrize("check", CACHE_CHECKS, ids=by_name)
def test_stub_is_not_implemented(check):
    fails_with(check, StubCache, ["not implemented yet", "StubCache."])


def test_hidden_variant_passes():
    assert "worst |Δ|" in passes(ch08.check_int8_logits, QuantizedPagedKVCache, block_size=8, seed=1)


# ---- planted bugs in quantize_into: the reference with one thing wrong, shown as a diff -------------

NoRounding = mutant(QuantizedPagedKVCache, "quantize_into", """
-    codes = torch.round(rows.float() / new[where][:, :, None]).clamp(-QMAX, QMAX)
+    codes = torch.trunc(rows.float() / new[where][:, :, None]).clamp(-QMAX, QMAX)
""", name="NoRounding")
# The first write fixes the scale: later, larger tokens are clamped.
ClampAtFirstScale = mutant(QuantizedPagedKVCache, "quantize_into", """
-    new = torch.maximum(old, wanted).clamp(min=SCALE_FLOOR)
+    new = torch.where(old > 0, old, wanted).clamp(min=SCALE_FLOOR)
""", name="ClampAtFirstScale")
GrowWithoutRequantize = mutant(QuantizedPagedKVCache, "quantize_into", """
-    kept = pool[touched].float() * (old / new)[:, :, None, None]
-    pool[touched] = torch.round(kept).to(pool.dtype)
""", name="GrowWithoutRequantize")
KeepsPreviousOwnersScale = mutant(QuantizedPagedKVCache, "quantize_into", """
-    old = torch.where((first > 0)[:, None], scales[touched], 0.0)
+    old = scales[touched].clone()
""", name="KeepsPreviousOwnersScale")
OneScalePerBlock = mutant(QuantizedPagedKVCache, "quantize_into", """
-    need = rows.abs().amax(dim=-1).float() / QMAX
+    need = rows.abs().amax(dim=-1).float() / QMAX
+    need = need.amax(dim=-1, keepdim=True).expand_as(need)        # one for all KV heads
""", name="OneScalePerBlock")
OneScaleForThePool = mutant(QuantizedPagedKVCache, "quantize_into", """
-    scales[touched] = new
+    scales[:] = new.amax(dim=0)
""", name="OneScaleForThePool")
Divides128 = mutant(QuantizedPagedKVCache, "quantize_into", """
-    need = rows.abs().amax(dim=-1).float() / QMAX
+    need = rows.abs().amax(dim=-1).float() / 128
""", name="Divides128")
# The scale follows the latest write down, below tokens already stored.
ScaleShrinks = mutant(QuantizedPagedKVCache, "quantize_into", """
-    new = torch.maximum(old, wanted).clamp(min=SCALE_FLOOR)
+    new = wanted.clamp(min=SCALE_FLOOR)
""", name="ScaleShrinks")
NoScaleFloor = mutant(QuantizedPagedKVCache, "quantize_into", """
-    new = torch.maximum(old, wanted).clamp(min=SCALE_FLOOR)
+    new = torch.maximum(old, wanted)
""", name="NoScaleFloor")


RoundsDown = mutant(QuantizedPagedKVCache, "quantize_into", """
-    codes = torch.round(rows.float() / new[where][:, :, None]).clamp(-QMAX, QMAX)
+    codes = torch.floor(rows.float() / new[where][:, :, None]).clamp(-QMAX, QMAX)
""", name="RoundsDown")
# Adds 0.5 and casts: right for positive values, one step off for most negative ones.
AddsHalfAndCasts = mutant(QuantizedPagedKVCache, "quantize_into", """
-    codes = torch.round(rows.float() / new[where][:, :, None]).clamp(-QMAX, QMAX)
+    codes = torch.trunc(rows.float() / new[where][:, :, None] + 0.5).clamp(-QMAX, QMAX)
""", name="AddsHalfAndCasts")
# Re-rounds the codes already in a block by a bare cast, which truncates.
RequantizeTruncates = mutant(QuantizedPagedKVCache, "quantize_into", """
-    pool[touched] = torch.round(kept).to(pool.dtype)
+    pool[touched] = kept.to(pool.dtype)
""", name="RequantizeTruncates")
# Every block and head of a write gets the write's largest |value| / 127.
OneScalePerWrite = mutant(QuantizedPagedKVCache, "quantize_into", """
-    old = torch.where((first > 0)[:, None], scales[touched], 0.0)
+    wanted = wanted.amax().expand_as(wanted)
+    old = torch.where((first > 0)[:, None], scales[touched], 0.0)
""", name="OneScalePerWrite")
# A head's scale over all rows of the write, whatever block they go to.
HeadScaleAcrossBlocks = mutant(QuantizedPagedKVCache, "quantize_into", """
-    old = torch.where((first > 0)[:, None], scales[touched], 0.0)
+    wanted = wanted.amax(dim=0, keepdim=True).expand_as(wanted)
+    old = torch.where((first > 0)[:, None], scales[touched], 0.0)
""", name="HeadScaleAcrossBlocks")


class RescalesOtherBlocks(QuantizedPagedKVCache):
    """Re-rounds every block of the pool to its own max after each write: it rewrites blocks it does
    not own, shared ones included."""

    def quantize_into(self, pool, scales, blocks, offsets, rows):
        super().quantize_into(pool, scales, blocks, offsets, rows)
        others = torch.ones(pool.shape[0], dtype=torch.bool)
        others[blocks] = False
        scales[others] = scales[others] * 0.5


class FreshPerWrite(QuantizedPagedKVCache):
    """Decides "fresh block" once per write (its first row at offset 0), not per block."""

    def quantize_into(self, pool, scales, blocks, offsets, rows):
        for block in torch.unique(blocks).tolist():
            mine = blocks == block
            old = scales[block].clone() if int(offsets[0]) > 0 else torch.zeros_like(scales[block])
            new = torch.maximum(old, rows[mine].abs().amax(dim=(0, 2)) / QMAX).clamp(min=SCALE_FLOOR)
            pool[block] = torch.round(pool[block].float() * (old / new)[:, None, None]).to(pool.dtype)
            scales[block] = new
            codes = torch.round(rows[mine] / new[None, :, None]).clamp(-QMAX, QMAX)
            pool[block, :, offsets[mine]] = codes.to(pool.dtype).transpose(0, 1)


class RowByRow(QuantizedPagedKVCache):
    """Quantizes one row at a time, growing the scale (and re-rounding) row by row."""

    def quantize_into(self, pool, scales, blocks, offsets, rows):
        for block, offset, row in zip(blocks.tolist(), offsets.tolist(), rows):
            old = scales[block].clone() if offset > 0 else torch.zeros_like(scales[block])
            new = torch.maximum(old, row.abs().amax(dim=-1) / QMAX).clamp(min=SCALE_FLOOR)
            pool[block] = torch.round(pool[block].float() * (old / new)[:, None, None]).to(pool.dtype)
            scales[block] = new
            pool[block, :, offset] = torch.round(row / new[:, None]).clamp(-QMAX, QMAX).to(pool.dtype)


# ---- planted bugs in dequantize ------------------------------------------------------------------

ForgetsTheScale = mutant(QuantizedPagedKVCache, "dequantize", """
-    return codes * scales[blocks].to(self.read_dtype)[..., None, None]
+    return codes
""", name="ForgetsTheScale")


class ScaleByPosition(QuantizedPagedKVCache):
    def dequantize(self, pool, scales, blocks):
        position = torch.arange(blocks.numel()).view_as(blocks) % scales.shape[0]
        return pool[blocks].to(self.read_dtype) * scales[position][..., None, None]


class ReadsInFloat64(QuantizedPagedKVCache):
    def dequantize(self, pool, scales, blocks):
        return pool[blocks].double() * scales[blocks][..., None, None].double()


class OneScaleAcrossHeads(QuantizedPagedKVCache):
    def dequantize(self, pool, scales, blocks):
        return pool[blocks].to(self.read_dtype) * scales[blocks].mean(dim=-1)[..., None, None, None]


# ---- planted bugs in copy_on_write ---------------------------------------------------------------

class CopyForgetsScales(QuantizedPagedKVCache):
    def copy_on_write(self, seq, index):
        PagedKVCache.copy_on_write(self, seq, index)


CopyKeyScalesOnly = mutant(QuantizedPagedKVCache, "copy_on_write", """
-        for scales in self.k_scales + self.v_scales:
+        for scales in self.k_scales:
""", name="CopyKeyScalesOnly")


class WritesIntoTheSharedBlock(QuantizedPagedKVCache):
    """No copy at all: the next write would requantize a block another sequence reads."""

    def copy_on_write(self, seq, index):
        pass


@pytest.mark.parametrize("check, bug, words", [
    (ch08.check_quantize_on_write, NoRounding, ["truncated toward zero", "torch.round"]),
    (ch08.check_quantize_on_write, ClampAtFirstScale, ["scale stayed where the first tokens set it",
                                                       "clamped"]),
    (ch08.check_quantize_on_write, GrowWithoutRequantize, ["codes of its first 3 tokens are unchanged",
                                                           "re-round"]),
    (ch08.check_quantize_on_write, KeepsPreviousOwnersScale, ["offset 0", "previous owner's scale"]),
    (ch08.check_quantize_on_write, OneScalePerBlock, ["one scale per block per KV head"]),
    (ch08.check_quantize_on_write, OneScaleForThePool, ["one scale for the whole pool"]),
    (ch08.check_quantize_on_write, Divides128, ["127"]),
    (ch08.check_quantize_on_write, ScaleShrinks, ["must still cover the 2 tokens already stored"]),
    (ch08.check_quantize_on_write, RescalesOtherBlocks, ["was not written", "another sequence may be reading"]),
    (ch08.check_quantize_on_write, FreshPerWrite, ["fresh block 5", "decide per block"]),
    (ch08.check_quantize_on_write, RowByRow, ["one step off", "one at a time"]),
    (ch08.check_quantize_on_write, NoScaleFloor, ["all-zero token", "SCALE_FLOOR"]),
    (ch08.check_quantize_on_write, RoundsDown, ["rounded down (floor)"]),
    (ch08.check_quantize_on_write, AddsHalfAndCasts, ["+ 0.5) cast", "negative values the wrong way"]),
    (ch08.check_quantize_on_write, RequantizeTruncates, ["re-rounded", "truncated toward zero"]),
    (ch08.check_quantize_on_write, OneScalePerWrite, ["one scale per block per KV head"]),
    (ch08.check_quantize_on_write, HeadScaleAcrossBlocks, ["across blocks", "its own rows only"]),
    (ch08.check_dequantize_on_read, ReadsInFloat64, ["the dtype", "self.read_dtype"]),
    (ch08.check_dequantize_on_read, ForgetsTheScale, ["raw codes", "multiply each code by its block's scale"]),
    (ch08.check_dequantize_on_read, ScaleByPosition, ["by position in `blocks`", "scales[blocks]"]),
    (ch08.check_dequantize_on_read, OneScaleAcrossHeads, ["each KV head has its own scale"]),
    (ch08.check_copy_on_write_carries_scales, CopyForgetsScales, ["none of the scales", "every layer"]),
    (ch08.check_copy_on_write_carries_scales, CopyKeyScalesOnly, ["V scales"]),
    (ch08.check_copy_on_write_carries_scales, WritesIntoTheSharedBlock, ["left sequence 1 on the shared block",
                                                                         "PagedKVCache.copy_on_write"]),
    # the same bugs in the engine, through the milestone checks
    (ch08.check_sharing_keeps_scales, WritesIntoTheSharedBlock, ["would requantize K/V another sequence reads"]),
    (ch08.check_sharing_keeps_scales, RescalesOtherBlocks, ["the parent's block 0 changed",
                                                           "another sequence may be reading"]),
    (ch08.check_sharing_keeps_scales, CopyForgetsScales, ["from-scratch run", "none of the scales"]),
], ids=by_name)
def test_bug_is_caught(check, bug, words):
    fails_with(check, bug, words)


@pytest.mark.parametrize("bug, words", [
    (FreshPerWrite, ["decide per block"]), (ClampAtFirstScale, ["allowed 0.25", "clamped"]),
    (ForgetsTheScale, ["raw codes"]), (GrowWithoutRequantize, ["re-round"]),
    (OneScaleForThePool, ["one scale for the whole pool"]), (CopyForgetsScales, ["none of the scales"]),
], ids=by_name)
def test_bug_breaks_the_int8_logits_with_its_hint(bug, words):
    fails_with(ch08.check_int8_logits, bug, ["from-scratch run", *words])


@pytest.mark.parametrize("bug, words", [
    (NoRounding, ["truncated toward zero", "the written codes"]),
    (OneScalePerWrite, ["one scale for the whole write", "the scales of block 0"]),
    (RoundsDown, ["rounded down (floor)"]),
    (AddsHalfAndCasts, ["negative values the wrong way"]),
    (RequantizeTruncates, ["already held, re-rounded", "truncated toward zero"]),
    (OneScalePerBlock, ["both heads of a block got one scale"]),
    (HeadScaleAcrossBlocks, ["across blocks"]),
], ids=by_name)
@pytest.mark.parametrize("block_size, seed", [(4, 0), (8, 1)])
def test_the_int8_logits_check_audits_every_write(bug, words, block_size, seed):
    """Bugs whose logits stay within INT8_ATOL (or barely leave it) still fail the decisive check, at the
    first write that breaks the rule, with the hint that names the bug."""
    fails_with(lambda cls: ch08.check_int8_logits(cls, block_size=block_size, seed=seed), bug,
               [("did not store what quantize_into must", "the first write that breaks the rule"), *words])


@pytest.mark.parametrize("bug", [NoRounding, ClampAtFirstScale, GrowWithoutRequantize, KeepsPreviousOwnersScale,
                                 OneScalePerBlock, OneScaleForThePool, Divides128, ScaleShrinks,
                                 RescalesOtherBlocks, FreshPerWrite, RowByRow, RoundsDown, AddsHalfAndCasts,
                                 RequantizeTruncates, OneScalePerWrite, HeadScaleAcrossBlocks], ids=by_name)
def test_a_quantize_bug_leaves_the_other_exercises_passing(bug):
    ch08.check_dequantize_on_read(bug)
    ch08.check_copy_on_write_carries_scales(bug)


# ---- Exercise 8.2: bytes per token from a config dict ---------------------------------------------

def kv_bytes(hf, dtype_bytes=2):
    layers = hf["num_hidden_layers"]
    if "kv_lora_rank" in hf:
        return layers * (hf["kv_lora_rank"] + hf["qk_rope_head_dim"]) * dtype_bytes
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def gqa_only(hf, dtype_bytes=2):
    heads = hf["num_attention_heads"]
    return (2 * hf["num_hidden_layers"] * (hf.get("num_key_value_heads") or heads)
            * (hf.get("head_dim") or hf["hidden_size"] // heads) * dtype_bytes)


def mla_twice(hf, dtype_bytes=2):
    return 2 * kv_bytes(hf, dtype_bytes) if "kv_lora_rank" in hf else kv_bytes(hf, dtype_bytes)


def latent_only(hf, dtype_bytes=2):
    if "kv_lora_rank" in hf:
        return hf["num_hidden_layers"] * hf["kv_lora_rank"] * dtype_bytes
    return kv_bytes(hf, dtype_bytes)


def all_query_heads(hf, dtype_bytes=2):
    return kv_bytes({**hf, "num_key_value_heads": hf["num_attention_heads"]}, dtype_bytes)


def ignores_head_dim(hf, dtype_bytes=2):
    return kv_bytes({k: v for k, v in hf.items() if k != "head_dim"}, dtype_bytes)


def head_dim_default(hf, dtype_bytes=2):
    """Reads head_dim with a default, which a present "head_dim": null does not use."""
    heads = hf["num_attention_heads"]
    if "kv_lora_rank" in hf:
        return kv_bytes(hf, dtype_bytes)
    head_dim = hf.get("head_dim", hf["hidden_size"] // heads)
    return 2 * hf["num_hidden_layers"] * (hf.get("num_key_value_heads") or heads) * head_dim * dtype_bytes


def head_dim_null_is_zero(hf, dtype_bytes=2):
    """Treats "head_dim": null as 0."""
    if "head_dim" in hf and hf["head_dim"] is None:
        return 0
    return kv_bytes(hf, dtype_bytes)


def one_layer(hf, dtype_bytes=2):
    return kv_bytes(hf, dtype_bytes) // hf["num_hidden_layers"]


def always_two_bytes(hf, dtype_bytes=2):
    return kv_bytes(hf, 2)


def test_kv_bytes_reference_passes():
    assert "69,120 B/token" in passes(ch08.check_kv_bytes_from_config, kv_bytes)
    assert ch08.kv_bytes_reference(ch08.load_hf("deepseek-v2")) == 60 * 576 * 2


@pytest.mark.parametrize("bug, words", [
    (gqa_only, ["deepseek-v2", "expected 69120", "kv_lora_rank is MLA"]),
    (mla_twice, ["expected 69120, got 138240", "count it once"]),
    (latent_only, ["expected 69120, got 61440", "RoPE key"]),
    (all_query_heads, ["llama-3-8b", "num_key_value_heads"]),
    (ignores_head_dim, ["qwen3-0.6b", "head_dim"]),
    (one_layer, ["llama-2-13b", "num_hidden_layers"]),
    (always_two_bytes, ["dtype_bytes=1", "not a fixed 2"]),
    (head_dim_default, ['"head_dim": null', "crashed with TypeError", "hidden_size // num_attention_heads"]),
    (head_dim_null_is_zero, ['"head_dim": null', "expected 131072, got 0", "hidden_size // num_attention_heads"]),
], ids=by_name)
def test_kv_bytes_bug_is_caught(bug, words):
    fails_with(ch08.check_kv_bytes_from_config, bug, words)


def test_kv_bytes_stub_is_not_implemented():
    def stub(hf, dtype_bytes=2):
        raise NotImplementedError()
    assert "not implemented yet" in fails(ch08.check_kv_bytes_from_config, stub)


# ---- auto-graded review questions ------------------------------------------------------------------

def test_review_answers_pass():
    passes(ch08.check_review_int8_bytes, 2 * 80 * 8 * 128 + 2 * 80 * 8 * 4 / 16)
    passes(ch08.check_review_mla_block, "c")
    passes(ch08.check_review_table_entries, 2084)


@pytest.mark.parametrize("check, answer, words", cases({
    ch08.check_review_int8_bytes: {None: ["not answered yet"], 163_840: ["codes alone", "scales"], 327_680: ["fp16"],
                                   163_840 + 5_120: ["divide them by the block size"]},
    ch08.check_review_mla_block: {None: ["not answered yet"], "d": ["128 MLA tokens", "69,120"], "e": ["one letter"]},
    ch08.check_review_table_entries: {6_250: ["blocks of 16"], 2_083: ["partial block", "round up"],
                                      "many": ["must be a number"]},
}))
def test_review_wrong_answers_get_their_hint(check, answer, words):
    fails_with(check, answer, words)


def test_a_wrong_answer_restates_the_question_with_its_numbers():
    """R3's wrong answer says what the question asks: the numbers come from the check's R3, the ones the
    question's text states (below)."""
    message = fails(ch08.check_review_table_entries, 16_384)
    assert "16384 is not the number of block-table entries of one 100,000-token sequence in blocks of 48" in message
    assert "ceil(100,000 / 48)" in message
    assert "16,384 answers an earlier wording of R3 (1,048,576 tokens in blocks of 64)" in message  # a kept notebook
    assert "int8 blocks of 16 (80 layers, 8 KV heads of 128" in fails(ch08.check_review_int8_bytes, 1)


def test_the_questions_text_states_the_checks_numbers():
    """The markdown of R1 and R3 names the numbers their checks compute with (one source for both)."""
    from engine.course.paths import chapter_files
    from engine.course.authoring.source import load_chapter
    [path] = [p for p in chapter_files() if p.stem.startswith("ch08_")]
    text = {cell.metadata.get("nbgrader", {}).get("grade_id"): " ".join(cell.source.split())
            for cell in load_chapter(path).cells}
    r1, r3 = ch08.R1, ch08.R3
    r1_text, r3_text = text["ch08_review_md"], text["ch08_r3_md"]
    assert (f"({r1['layers']} layers, {r1['kv_heads']} KV heads of {r1['head_dim']})" in r1_text
            and f"int8 blocks of {r1['block_size']} tokens" in r1_text), r1_text
    assert (f"one sequence of {r3['tokens']:,} tokens" in r3_text
            and f"blocks of {r3['block_size']} tokens" in r3_text), r3_text


def test_dequantize_and_copy_checks_run_without_quantize_into():
    """Each exercise's check runs on its own method: a learner may write them in any order."""
    unwritten = stub(QuantizedPagedKVCache, "quantize_into", name="QuantizeNotWritten")
    passes(ch08.check_dequantize_on_read, unwritten)
    passes(ch08.check_copy_on_write_carries_scales, unwritten)


# ---- the decisive check writes text: the trained model through the learner's int8 blocks ----------------

@pytest.mark.parametrize("bug", [ClampAtFirstScale, OneScaleForThePool], ids=by_name)
def test_the_int8_logits_check_writes_the_divergence_out_as_text(bug):
    """Int8 is not exact, so the other sentence is the engine's int8 cache's: the message shows both and the
    token where they part."""
    text = ch08.continuations.side_by_side(ch08.written_out(bug), reference=ch08.written_out(QuantizedPagedKVCache))
    assert text.parted_at is not None and text.scratch != text.cached
    message = fails_with(ch08.check_int8_logits, bug, ["The trained tiny model writes it out: the engine's: ",
                                                       ", yours: ", f", token {text.parted_at}"])
    assert str(text) in message


def test_a_passing_int8_check_writes_no_text(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("continuations computed for a passing check")
    monkeypatch.setattr(ch08.continuations, "shown", never)
    passes(ch08.check_int8_logits, QuantizedPagedKVCache)
