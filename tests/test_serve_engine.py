"""The continuous-batching engine: preemption keeps every answer exact, nothing leaks, edges hold."""
import random

import pytest
import torch

from engine.cache.paged import PagedKVCache
from engine.generate import generate, scratch_logits
from engine.sampling import SamplingParams
from engine.serve.engine import Engine
from engine.serve.request import RequestTooLarge, Status
from engine.serve.scheduler import SchedulerConfig

GREEDY = SamplingParams(max_tokens=14, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def prompts(count=6, low=6, high=30, seed=3):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(low, high))] for _ in range(count)]


def assert_no_leak(engine):
    """Every block is either free or held only by the prefix cache, and nothing else is alive."""
    cache = engine.cache
    assert not cache.tables and not cache.swapped and not engine.scheduler.has_work()
    if engine.scheduler.prefix is not None:
        engine.scheduler.prefix.reset()                # refuses if a sequence still held a cached block
    assert cache.allocator.num_free == cache.allocator.num_blocks
    assert all(count == 0 for count in cache.allocator.refs)


def assert_matches_scratch(model, requests, tolerance=1e-5):
    """Each sampled token came from logits within `tolerance` of a from-scratch run of its history."""
    for request in requests:
        for seq in request.sequences:
            reference = scratch_logits(model, [seq.tokens])[0]
            assert len(seq.logits) == len(seq.output)
            for i, row in enumerate(seq.logits):
                torch.testing.assert_close(row, reference[seq.prompt_len - 1 + i], rtol=0, atol=tolerance)


def test_both_kinds_of_preemption_keep_outputs_exact(tiny):
    batch = prompts()
    solo = [Engine(tiny, PagedKVCache(tiny.config, 64, 4)).generate([p], GREEDY)[0].outputs[0] for p in batch]
    assert solo == [g.tokens for g in generate(tiny, batch, GREEDY)]   # solo runs agree with scratch
    cache = PagedKVCache(tiny.config, num_blocks=12, block_size=4)     # room for ~1.5 of 6 requests
    config = SchedulerConfig(max_batched_tokens=32, margin_blocks=1, preemption="auto", swap_min_tokens=16)
    engine = Engine(tiny, cache, config, keep_logits=True)
    requests = engine.generate(batch, GREEDY)
    assert engine.scheduler.preemptions["recompute"] > 0 and engine.scheduler.preemptions["swap"] > 0
    assert [r.outputs[0] for r in requests] == solo
    assert_matches_scratch(tiny, requests)
    assert engine.scheduler.prefix_stats["hits"] > 0                    # replays found their own blocks
    assert_no_leak(engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_each_preemption_mode_alone(tiny, mode):
    batch = prompts(count=4, seed=5)
    solo = [g.tokens for g in generate(tiny, batch, GREEDY)]
    cache = PagedKVCache(tiny.config, num_blocks=12, block_size=4)
    engine = Engine(tiny, cache, SchedulerConfig(max_batched_tokens=32, margin_blocks=1, preemption=mode),
                    prefix_caching=False)
    requests = engine.generate(batch, GREEDY)
    other = {"recompute": "swap", "swap": "recompute"}[mode]
    assert engine.scheduler.preemptions[mode] > 0 and engine.scheduler.preemptions[other] == 0
    assert [r.outputs[0] for r in requests] == solo
    assert_no_leak(engine)


def test_request_larger_than_the_pool_is_rejected_and_harms_nothing(tiny):
    cache = PagedKVCache(tiny.config, num_blocks=8, block_size=4)       # 32 token slots
    engine = Engine(tiny, cache, SchedulerConfig(max_batched_tokens=32, margin_blocks=0))
    keep = engine.add_request(list(range(10)), GREEDY)
    with pytest.raises(RequestTooLarge, match=r"prompt of 40 tokens needs 40 .* holds 32"):
        engine.add_request(list(range(40)), GREEDY)
    with pytest.raises(RequestTooLarge, match=r"prompt of 30 plus up to 14 .* needs 43 .* holds 32"):
        engine.add_request(list(range(30)), GREEDY)
    assert list(engine.requests) == [keep.request_id] and len(engine.scheduler.waiting) == 1
    engine.run()
    assert keep.outputs[0] == generate(tiny, [list(range(10))], GREEDY)[0].tokens
    assert_no_leak(engine)


def crowded_engine(tiny):
    """Five prompts on a 12-block pool: some run, some wait, and long ones get swapped out."""
    cache = PagedKVCache(tiny.config, num_blocks=12, block_size=4)
    engine = Engine(tiny, cache, SchedulerConfig(max_batched_tokens=32, margin_blocks=1, swap_min_tokens=8))
    return engine, [engine.add_request(p, GREEDY) for p in prompts(count=5, seed=7)]


def test_abort_anywhere_and_a_failed_step_leak_nothing(tiny):
    engine, requests = crowded_engine(tiny)
    for _ in range(6):
        engine.step()
    states = {r.request_id: r.sequences[0].status for r in requests}
    assert Status.RUNNING in states.values() and Status.WAITING in states.values()
    running = next(r for r in requests if r.sequences[0].status is Status.RUNNING)
    waiting = next(r for r in requests if r.sequences[0].status is Status.WAITING)
    engine.abort(running.request_id)
    engine.abort(waiting.request_id)
    assert running.sequences[0].finish_reason == "aborted" and waiting.finished

    class Broken:                                      # the forward fails after reserve succeeded
        def execute(self, chunks):
            raise RuntimeError("device lost")
    engine.runner, runner = Broken(), engine.runner
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()
    engine.runner = runner
    engine.run()
    survivors = [r for r in requests if r not in (running, waiting)]
    solo = generate(tiny, [r.prompt for r in survivors], GREEDY)
    assert [r.outputs[0] for r in survivors] == [g.tokens for g in solo]
    assert_no_leak(engine)


def test_abort_a_swapped_out_request(tiny):
    engine, requests = crowded_engine(tiny)
    cache = engine.scheduler.cache
    for _ in range(40):
        engine.step()
        swapped = [r for r in requests if r.sequences and r.sequences[0].status is Status.SWAPPED]
        if swapped:
            break
    assert swapped and cache.swapped, "this pressure should swap a sequence out"
    engine.abort(swapped[0].request_id)
    assert not cache.swapped and swapped[0].sequences[0].finish_reason == "aborted"
    engine.run()
    survivors = [r for r in requests if r is not swapped[0]]
    solo = generate(tiny, [r.prompt for r in survivors], GREEDY)
    assert [r.outputs[0] for r in survivors] == [g.tokens for g in solo]
    assert_no_leak(engine)


def test_abort_after_a_failed_step_frees_everything(tiny):
    cache = PagedKVCache(tiny.config, num_blocks=16, block_size=4)
    engine = Engine(tiny, cache, prefix_caching=False)
    requests = [engine.add_request(p, GREEDY) for p in prompts(count=3)]
    engine.step()

    class Broken:
        def execute(self, chunks):
            raise RuntimeError("out of device memory")
    engine.runner = Broken()
    with pytest.raises(RuntimeError):
        engine.step()
    for request in requests:
        engine.abort(request.request_id)
    assert_no_leak(engine)


def test_fully_cached_block_aligned_prompt(tiny):
    prompt = list(range(3, 19))                        # 16 tokens: exactly 4 blocks of 4
    cache = PagedKVCache(tiny.config, num_blocks=32, block_size=4)
    engine = Engine(tiny, cache, keep_logits=True)
    first = engine.generate([prompt], GREEDY)[0]
    second = engine.generate([prompt], GREEDY)[0]      # every block cached: one token still prefilled
    assert second.sequences[0].cached_tokens == 15
    assert first.outputs == second.outputs == [generate(tiny, [prompt], GREEDY)[0].tokens]
    assert_matches_scratch(tiny, [first, second])
    assert engine.scheduler.prefix_stats["tokens_saved"] == 15
    assert_no_leak(engine)


def test_prefix_hit_after_a_recompute_preemption(tiny):
    prompt = list(range(40, 62))                       # 22 tokens: 5 full blocks of 4, then 2
    cache = PagedKVCache(tiny.config, num_blocks=32, block_size=4)
    engine = Engine(tiny, cache, SchedulerConfig(preemption="recompute"), keep_logits=True)
    request = engine.add_request(prompt, GREEDY)
    for _ in range(4):
        engine.step()                                  # prefill + 3 decodes: 25 tokens computed
    seq = request.sequences[0]
    assert engine.scheduler.preempt(seq) == "recompute" and seq.num_computed == 0
    engine.run()
    assert seq.preemptions == 1 and seq.cached_tokens == 24   # its own 6 full blocks came back
    assert request.outputs[0] == generate(tiny, [prompt], GREEDY)[0].tokens
    assert_matches_scratch(tiny, [request])
    assert_no_leak(engine)


def test_chunked_prefill_and_mixed_batches_match_generate(tiny):
    batch = prompts(count=4, low=30, high=60, seed=11)
    cache = PagedKVCache(tiny.config, num_blocks=64, block_size=16)
    engine = Engine(tiny, cache, SchedulerConfig(max_batched_tokens=20))   # prompts span several steps
    params = SamplingParams(max_tokens=8, temperature=0.8, top_k=20, ignore_eos=True)
    requests = engine.generate(batch, params, seeds=[1, 2, 3, 4])
    assert max(s.rows for s in engine.metrics.steps) > 1
    assert all(s.tokens <= 20 for s in engine.metrics.steps)
    expected = generate(tiny, batch, [SamplingParams(0.8, 20, 1.0, 8, seed, True) for seed in (1, 2, 3, 4)])
    assert [r.outputs[0] for r in requests] == [g.tokens for g in expected]
    assert_no_leak(engine)


def test_static_slots_run_through_the_same_engine(tiny):
    from engine.cache.static import StaticKVCache
    batch = prompts(count=5, seed=13)
    cache = StaticKVCache(tiny.config, max_seqs=2, capacity=48)      # two slots: the rest must wait
    engine = Engine(tiny, cache, SchedulerConfig(max_batched_tokens=32))
    requests = engine.generate(batch, GREEDY)
    assert max(s.running for s in engine.metrics.steps) == 2
    assert [r.outputs[0] for r in requests] == [g.tokens for g in generate(tiny, batch, GREEDY)]
    assert not cache.slot and len(cache.free_slots) == 2
    with pytest.raises(RequestTooLarge, match="holds 48"):
        engine.add_request(list(range(40)), GREEDY)                 # 40 + 14 - 1 > one slot of 48


def test_the_scheduler_reads_cache_abilities_from_the_protocols(tiny):
    from engine.cache.protocol import capabilities
    from engine.cache.static import StaticKVCache
    from engine.tools.contiguous import ContiguousKVCache
    paged = capabilities(PagedKVCache(tiny.config, num_blocks=8, block_size=4))
    assert (paged.paged, paged.swappable, paged.up_front, paged.max_request_tokens) == (True, True, False, 32)
    slots = capabilities(StaticKVCache(tiny.config, max_seqs=2, capacity=48))
    assert (slots.paged, slots.swappable, slots.up_front, slots.max_request_tokens) == (False, False, False, 48)
    region = capabilities(ContiguousKVCache(tiny.config, 256, "pow2", max_len=100))
    assert (region.paged, region.up_front, region.max_request_tokens) == (False, True, 100)

    class Sizeless:                                    # the six protocol methods, but no size
        create = reserve = set_batch = update = free = length = None
    with pytest.raises(TypeError, match="says nothing about its size"):
        capabilities(Sizeless())
    with pytest.raises(TypeError, match="lacks create"):
        capabilities(object())
