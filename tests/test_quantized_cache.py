"""QuantizedPagedKVCache: int8 blocks with one scale per block per KV head, stored beside the block.

Logits stay within INT8_ATOL of the fp32 from-scratch run; the scales travel with their block through
copy-on-write, fork, swap and prefix sharing; a shared block is never rewritten; bytes per token halve.
"""
import pytest
import torch

from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.cache.quantized import QMAX, QuantizedPagedKVCache, kv_bytes_per_token
from engine.checks import tiny
from engine.checks.ch08 import INT8_ATOL
from engine.config import known_config
from engine.generate import cached_step, generate, scratch_logits
from engine.sampling import SamplingParams
from engine.seeded import seeded_tokens

pytestmark = pytest.mark.usefixtures("one_thread")


def make(num_blocks=32, block_size=4):
    return QuantizedPagedKVCache(tiny().config, num_blocks, block_size)


def forked(prompt: list[int], model=None):
    """A fresh int8 cache holding `prompt` as sequence 0, forked into sequence 1 (the blocks shared)."""
    cache = make()
    cache.create(0)
    cached_step(model or tiny(), cache, [0], [prompt])
    cache.fork(0, 1)
    return cache


def block_bytes(cache, block):
    return [t[block].clone() for t in cache.k_pools + cache.v_pools + cache.k_scales + cache.v_scales]


@pytest.mark.parametrize("block_size", [1, 4, 8])
def test_logits_within_tolerance_of_scratch_over_prefill_and_decode(block_size):
    model, bs = tiny(), block_size
    seqs = [seeded_tokens(n, seed=i) for i, n in enumerate([max(bs - 1, 1), bs, bs + 1, 2 * bs + 1])]
    cache = make(num_blocks=4 * (-(-(2 * bs + 25) // bs) + 1), block_size=bs)
    for s in range(4):
        cache.create(s)
    out = cached_step(model, cache, [0, 1, 2, 3], seqs)
    worst = max(float((o - w).abs().max()) for o, w in zip(out, scratch_logits(model, seqs)))
    for _ in range(20):
        new = [[int(o[-1].argmax())] for o in out]
        seqs = [s + n for s, n in zip(seqs, new)]
        out = cached_step(model, cache, [0, 1, 2, 3], new)
        worst = max(worst, max(float((o[-1] - w[-1]).abs().max())
                               for o, w in zip(out, scratch_logits(model, seqs))))
    assert worst <= INT8_ATOL
    assert worst > 1e-4            # it really is quantized


def test_stores_int8_codes_and_a_scale_per_block_per_head():
    cache = make()
    assert all(p.dtype == torch.int8 for p in cache.k_pools + cache.v_pools)
    assert all(s.shape == (cache.num_blocks, tiny().config.num_kv_heads) for s in cache.k_scales)
    cache.create(0)
    cached_step(tiny(), cache, [0], [seeded_tokens(6, seed=1)])
    block = cache.tables[0][0]
    codes = cache.k_pools[0][block]
    assert int(codes.abs().amax(dim=(1, 2)).min()) == QMAX   # each head's largest value maps to 127


def test_a_growing_scale_re_rounds_the_codes_and_other_blocks_stay_put():
    cache = make(num_blocks=4)
    pool, scales = cache.k_pools[0], cache.k_scales[0]
    small = torch.full((1, 2, 16), 0.5)
    cache.quantize_into(pool, scales, torch.tensor([1]), torch.tensor([0]), small)
    other = pool[2].clone()
    assert torch.allclose(scales[1], torch.full((2,), 0.5 / QMAX))
    cache.quantize_into(pool, scales, torch.tensor([1]), torch.tensor([1]), small * 4)
    assert torch.allclose(scales[1], torch.full((2,), 2.0 / QMAX))
    assert torch.equal(pool[1, :, 0], torch.full((2, 16), 32, dtype=torch.int8))   # round(127 / 4)
    assert torch.equal(pool[1, :, 1], torch.full((2, 16), QMAX, dtype=torch.int8))
    assert torch.equal(pool[2], other)


def test_a_write_at_offset_zero_forgets_the_previous_owner():
    cache = make(num_blocks=4)
    pool, scales = cache.k_pools[0], cache.k_scales[0]
    cache.quantize_into(pool, scales, torch.tensor([1, 1]), torch.tensor([0, 1]), torch.full((2, 2, 16), 9.0))
    cache.quantize_into(pool, scales, torch.tensor([1]), torch.tensor([0]), torch.full((1, 2, 16), 0.1))
    assert torch.allclose(scales[1], torch.full((2,), 0.1 / QMAX))
    assert int(pool[1, :, 1].abs().max()) == 0     # the old owner's codes are cleared


def test_copy_on_write_carries_the_scales():
    cache = forked(seeded_tokens(10, seed=2))
    old = cache.tables[0][2]
    cache.copy_on_write(1, 2)
    new = cache.tables[1][2]
    assert new != old
    assert all(torch.equal(a, b) for a, b in zip(block_bytes(cache, old), block_bytes(cache, new)))


def test_fork_then_diverge_leaves_the_shared_blocks_bit_identical():
    model, prompt = tiny(), seeded_tokens(10, seed=3)
    cache = forked(prompt, model)
    before = {b: block_bytes(cache, b) for b in cache.tables[0]}
    out = cached_step(model, cache, [0, 1], [[1, 2, 3], [200, 201, 202]])
    for block, saved in before.items():
        if block in cache.tables[0][:2]:                # full blocks: still shared
            assert all(torch.equal(a, b) for a, b in zip(saved, block_bytes(cache, block)))
    want = scratch_logits(model, [prompt + [1, 2, 3], prompt + [200, 201, 202]])
    for o, w in zip(out, want):
        assert float((o - w[-3:]).abs().max()) <= INT8_ATOL


def test_writing_into_a_shared_block_is_refused():
    cache = forked(seeded_tokens(6, seed=4))
    block = cache.tables[0][1]
    with pytest.raises(RuntimeError, match="requantize"):
        cache.store(0, torch.tensor([block]), torch.tensor([2]), torch.ones(1, 2, 16), torch.ones(1, 2, 16))


def test_swap_out_and_in_brings_back_codes_and_scales():
    model, cache = tiny(), make(num_blocks=12)
    prompt = seeded_tokens(9, seed=5)
    cache.create(0)
    cached_step(model, cache, [0], [prompt])
    tables = torch.tensor(cache.tables[0])
    history = [cache.dequantize(p, s, tables) for p, s in
               zip(cache.k_pools + cache.v_pools, cache.k_scales + cache.v_scales)]
    cache.swap_out(0)
    cache.create(1)
    cached_step(model, cache, [1], [seeded_tokens(8, seed=6)])       # reuses the freed blocks
    cache.swap_in(0)
    assert cache.tables[0] != tables.tolist()
    after = [cache.dequantize(p, s, torch.tensor(cache.tables[0])) for p, s in
             zip(cache.k_pools + cache.v_pools, cache.k_scales + cache.v_scales)]
    assert all(torch.equal(a, b) for a, b in zip(history, after))


def test_prefix_hit_shares_the_blocks_with_their_scales():
    model, cache = tiny(), make()
    prefix = PrefixCache(cache)
    prompt = seeded_tokens(12, seed=7)
    cache.create(0)
    cached_step(model, cache, [0], [prompt])
    prefix.remember(0, prompt)
    saved = {b: block_bytes(cache, b) for b in cache.tables[0]}
    other = prompt[:8] + seeded_tokens(3, seed=8)
    assert prefix.attach(1, other) == 8
    out = cached_step(model, cache, [1], [other[8:]])[0]
    assert float((out - scratch_logits(model, [other])[0][8:]).abs().max()) <= INT8_ATOL
    assert all(torch.equal(a, b) for block, data in saved.items() for a, b in zip(data, block_bytes(cache, block)))


def test_generate_runs_through_the_int8_cache_and_frees_everything():
    cache = make(num_blocks=24)
    prompts = [seeded_tokens(5, seed=9), seeded_tokens(11, seed=10)]
    outputs = generate(tiny(), prompts, SamplingParams(max_tokens=6, ignore_eos=True), cache=cache)
    assert [len(o.tokens) for o in outputs] == [6, 6]
    assert cache.allocator.num_free == 24


def test_bytes_per_token_halve_against_fp16():
    config = tiny().config
    fp16 = PagedKVCache(config, 8, 16, dtype=torch.float16)
    int8 = QuantizedPagedKVCache(config, 8, 16)
    fp16_bytes = sum(p.numel() * p.element_size() for p in fp16.k_pools + fp16.v_pools) / (8 * 16)
    assert fp16_bytes == config.kv_bytes_per_token(torch.float16)
    assert int8.bytes_per_token() == kv_bytes_per_token(config, "int8", 16)
    assert 0.5 <= int8.bytes_per_token() / fp16_bytes <= 0.5 + 4 / (16 * config.head_dim)


@pytest.mark.parametrize("name", ["llama-2-13b", "llama-3-8b", "llama-3-70b"])
def test_bytes_per_token_of_real_models_halve(name):
    config = known_config(name)
    fp16 = kv_bytes_per_token(config, "fp16")
    int8 = kv_bytes_per_token(config, "int8", 16)
    assert fp16 == config.kv_bytes_per_token(torch.float16)
    assert int8 == fp16 / 2 + 2 * config.num_layers * config.num_kv_heads * 4 / 16
    assert int8 / fp16 < 0.502


def test_triton_attention_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="dequantized"):
        QuantizedPagedKVCache(tiny().config, 4, 4, attention="triton")
    with pytest.raises(ValueError, match="int8"):
        kv_bytes_per_token(tiny().config, "int4")


@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_the_serving_engine_runs_on_int8_blocks_under_memory_pressure(preemption):
    from engine.serve.engine import Engine
    from engine.serve.scheduler import SchedulerConfig
    cache = make(num_blocks=14, block_size=4)
    config = SchedulerConfig(max_num_seqs=8, max_batched_tokens=64, margin_blocks=0, watermark=0.0,
                             preemption=preemption)
    engine = Engine(tiny(), cache, config, prefix_caching=False)
    prompts = [seeded_tokens(n, seed=20 + n) for n in (5, 9, 12, 7)]
    requests = engine.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    assert all(len(r.sequences[0].tokens) == len(p) + 10 for r, p in zip(requests, prompts))
    assert engine.metrics.summary(engine)[f"preemptions_{preemption}"] > 0
    assert cache.allocator.num_free == 14
