"""n-way parallel sampling and beam search, both built on fork + copy-on-write."""
import dataclasses

import pytest
import torch

from engine.cache.paged import PagedKVCache
from engine.generate import generate, scratch_logits
from engine.sampling import SamplingParams
from engine.serve.beam import beam_search
from engine.serve.engine import Engine
from engine.serve.scheduler import SchedulerConfig

PROMPT = [(7 * i + 3) % 256 for i in range(37)]       # 37 tokens: 2 full blocks of 16, then 5
SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_parallel_samples_share_the_prompt_and_equal_solo_runs(tiny):
    n, seed = 4, 100
    cache = PagedKVCache(tiny.config, num_blocks=64, block_size=16)
    engine = Engine(tiny, cache, prefix_caching=False)
    request = engine.add_request(PROMPT, SAMPLED, seed=seed, n=n)
    engine.step()                                      # one prefill, then the fork
    assert len(request.sequences) == n
    tables = [cache.tables[s.seq_id] for s in request.sequences]
    shared = tables[0][:2]
    assert all(t[:2] == shared for t in tables)        # the full prompt blocks are stored once...
    assert [cache.allocator.refcount(b) for b in shared] == [n, n]      # ...with one owner per sample
    assert cache.allocator.num_free == 64 - 3          # 3 prompt blocks, nothing copied yet
    engine.step()                                      # each sample writes its first token
    assert len({t[2] for t in (cache.tables[s.seq_id] for s in request.sequences)}) == n   # copied on write
    for _ in range(5):
        engine.step()
        assert [cache.allocator.refcount(b) for b in shared] == [n, n]   # until the samples finish
    engine.run()
    assert request.finished and cache.allocator.num_free == 64
    for index, sample in enumerate(request.outputs):
        solo_engine = Engine(tiny, PagedKVCache(tiny.config, num_blocks=64, block_size=16))
        solo = solo_engine.add_request(PROMPT, SAMPLED, seed=seed + index)
        solo_engine.run()
        assert sample == solo.outputs[0], f"sample {index} differs from its solo run"
        # a solo run draws what a from-scratch run draws (engine.checks.ch07 compares samples with the latter)
        assert solo.outputs[0] == generate(tiny, [PROMPT], dataclasses.replace(SAMPLED, seed=seed + index))[0].tokens
    assert len({tuple(o) for o in request.outputs}) > 1                 # the seeds really differ


def test_parallel_sampling_under_preemption_still_equals_solo(tiny):
    cache = PagedKVCache(tiny.config, num_blocks=9, block_size=8)
    config = SchedulerConfig(max_batched_tokens=32, margin_blocks=1, swap_min_tokens=44)
    engine = Engine(tiny, cache, config)
    request = engine.add_request(PROMPT, SAMPLED, seed=5, n=3)
    engine.run()
    assert sum(engine.scheduler.preemptions.values()) > 0
    for index, sample in enumerate(request.outputs):
        solo_engine = Engine(tiny, PagedKVCache(tiny.config, num_blocks=64, block_size=8))
        assert sample == solo_engine.generate([PROMPT], SAMPLED, seeds=[5 + index])[0].outputs[0]
    engine.scheduler.prefix.reset()
    assert cache.allocator.num_free == 9


def reference_beam_search(model, prompt, width, steps):
    """Full copies of every hypothesis, logits recomputed from scratch; ties by beam, then token."""
    beams = [([], 0.0)]
    for _ in range(steps):
        candidates = []
        for index, (tokens, score) in enumerate(beams):
            logprobs = torch.log_softmax(scratch_logits(model, [prompt + tokens])[0][-1], dim=-1)
            candidates += [(score + float(lp), index, token) for token, lp in enumerate(logprobs)]
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        beams = [(beams[index][0] + [token], score) for score, index, token in candidates[:width]]
    return beams


@pytest.mark.parametrize("width,steps,prompt_len", [(3, 7, 13), (4, 6, 16)])
def test_beam_search_equals_a_full_copy_reference(tiny, width, steps, prompt_len):
    prompt = PROMPT[:prompt_len]
    cache = PagedKVCache(tiny.config, num_blocks=64, block_size=4)
    result = beam_search(tiny, cache, prompt, width, steps)
    expected = reference_beam_search(tiny, prompt, width, steps)
    assert [b.tokens for b in result.beams] == [tokens for tokens, _ in expected]
    for beam, (_, score) in zip(result.beams, expected):
        assert beam.score == pytest.approx(score, abs=1e-4)
    assert result.peak_blocks < result.unshared_blocks     # the prompt was stored once, not `width` times
    assert cache.allocator.num_free == 64 and not cache.tables


def test_beam_search_frees_everything_when_the_pool_runs_out(tiny):
    cache = PagedKVCache(tiny.config, num_blocks=6, block_size=4)
    with pytest.raises(MemoryError):
        beam_search(tiny, cache, PROMPT[:13], width=4, max_tokens=8)
    assert cache.allocator.num_free == 6 and not cache.tables
