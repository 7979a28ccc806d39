"""Requests with arrival times: the engine queues each when its clock gets there and skips idle time."""
import torch

from engine.cache.paged import PagedKVCache
from engine.checkpoint import tiny_model
from engine.sampling import SamplingParams
from engine.serve.engine import Engine
from engine.serve.request import Status


def engine():
    model = tiny_model()
    return Engine(model, PagedKVCache(model.config, num_blocks=32, block_size=4, dtype=torch.float32))


def test_a_later_request_waits_for_its_arrival_and_an_idle_engine_skips_ahead():
    served = engine()
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    first = served.add_request([1, 2, 3], params, arrival=0.0)
    later = served.add_request([4, 5, 6], params, arrival=1000.0)
    assert later.sequences[0] not in served.scheduler.waiting and served.has_unfinished()
    served.step()
    assert first.sequences[0].status is Status.RUNNING and later.sequences[0].status is Status.WAITING
    assert served.now < 1000.0
    served.run(progress=False)
    assert first.finished and later.finished and served.now >= 1000.0
    assert later.arrival == 1000.0 and later.sequences[0].first_token_time >= 1000.0
    assert len(later.outputs[0]) == 3


def test_outputs_do_not_depend_on_arrival_times():
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    prompts = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]
    at_once, spread = engine(), engine()
    together = [at_once.add_request(p, params, seed=i) for i, p in enumerate(prompts)]
    apart = [spread.add_request(p, params, seed=i, arrival=5.0 * i) for i, p in enumerate(prompts)]
    at_once.run(progress=False)
    spread.run(progress=False)
    assert [r.outputs for r in together] == [r.outputs for r in apart]


def test_a_request_aborted_before_it_arrives_never_runs():
    served = engine()
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    served.add_request([1, 2], params, arrival=0.0)
    gone = served.add_request([3, 4], params, arrival=50.0, request_id=9)
    served.abort(9)
    served.run(progress=False)
    assert gone.finished and gone.sequences[0].finish_reason == "aborted" and gone.outputs == [[]]
    assert not served.upcoming and not served.has_unfinished() and 9 not in served.cache.tables
