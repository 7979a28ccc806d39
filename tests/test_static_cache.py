"""StaticKVCache and the cached generation loop against the from-scratch ground truth."""
import pytest
import torch

from engine.cache.errors import CacheFull
from engine.cache.protocol import KVCache
from engine.cache.static import StaticKVCache
from engine.generate import cached_step, generate, scratch_logits
from engine.sampling import SamplingParams

PROMPTS = [list(range(10, 27)), [5], list(range(100, 108))]     # ragged: 17, 1 and 8 tokens


def test_static_cache_follows_the_protocol(tiny):
    assert isinstance(StaticKVCache(tiny.config, 2, 8), KVCache)


def test_greedy_generation_through_the_cache_equals_from_scratch(tiny):
    params = SamplingParams(max_tokens=21, ignore_eos=True)       # prefill + 20 decode steps
    cache = StaticKVCache(tiny.config, max_seqs=3, capacity=64)
    cached = generate(tiny, PROMPTS, params, cache=cache, keep_logits=True)
    scratch = generate(tiny, PROMPTS, params, cache=None, keep_logits=True)
    for prompt, a, b in zip(PROMPTS, cached, scratch):
        assert a.tokens == b.tokens, f"prompt of {len(prompt)} tokens: tokens diverge"
        diff = max((x - y).abs().max().item() for x, y in zip(a.logits, b.logits))
        assert diff <= 1e-5, f"prompt of {len(prompt)} tokens: max |Δ logits| {diff:.2e}"
    assert cache.slot == {} and sorted(cache.free_slots) == [0, 1, 2]    # all slots given back


def test_every_cached_position_matches_scratch_logits(tiny):
    cache = StaticKVCache(tiny.config, max_seqs=3, capacity=32)
    for seq in range(3):
        cache.create(seq)
    # feed the prompts in uneven chunks: a prefill split across steps must still be exact
    chunks = [[PROMPTS[0][:5], PROMPTS[1][:1], PROMPTS[2][:3]], [PROMPTS[0][5:], [], PROMPTS[2][3:]]]
    got = [[] for _ in PROMPTS]
    for step in chunks:
        rows = [s for s, c in enumerate(step) if c]
        for seq, logits in zip(rows, cached_step(tiny, cache, rows, [step[s] for s in rows])):
            got[seq].append(logits)
    for seq, expected in enumerate(scratch_logits(tiny, PROMPTS)):
        assert torch.allclose(torch.cat(got[seq]), expected, atol=1e-5, rtol=0)
    assert [cache.length(s) for s in range(3)] == [len(p) for p in PROMPTS]


def test_cache_without_its_history_is_wrong(tiny):
    """The check above can fail: a cache that forgets earlier tokens gives different logits."""
    cache = StaticKVCache(tiny.config, max_seqs=1, capacity=32)
    cache.create(0)
    cached_step(tiny, cache, [0], [PROMPTS[0][:8]])
    cache.k[0].zero_()                                           # lose layer 0's keys
    late = cached_step(tiny, cache, [0], [PROMPTS[0][8:]])[0]
    assert (late - scratch_logits(tiny, [PROMPTS[0]])[0][8:]).abs().max() > 1e-3


def test_full_slot_raises_and_changes_nothing(tiny):
    cache = StaticKVCache(tiny.config, max_seqs=1, capacity=8)
    cache.create(0)
    cached_step(tiny, cache, [0], [[1, 2, 3, 4, 5, 6]])
    with pytest.raises(CacheFull, match="6 tokens; 3 more exceed its slot of 8"):
        cache.reserve(0, 3)
    assert cache.length(0) == 6
    with pytest.raises(CacheFull, match="all 1 slots"):
        cache.create(1)
    assert isinstance(CacheFull("x"), MemoryError)


def test_utilization_counts_reserved_but_empty_positions(tiny):
    cache = StaticKVCache(tiny.config, max_seqs=2, capacity=16)
    cache.create(0), cache.create(1)
    cached_step(tiny, cache, [0, 1], [[1] * 4, [2] * 12])
    assert cache.utilization() == pytest.approx(16 / 32)


def test_unknown_sequence_is_named(tiny):
    cache = StaticKVCache(tiny.config, max_seqs=1, capacity=8)
    for call in (lambda: cache.reserve(5, 1), lambda: cache.set_batch([5]), lambda: cache.free(5)):
        with pytest.raises(KeyError, match="sequence 5 is unknown"):
            call()
