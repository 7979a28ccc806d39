"""The generation loop's API and the `python -m engine generate` command."""
import subprocess
import sys

import pytest

from engine.cache.static import StaticKVCache
from engine.checkpoint import tiny_model
from engine.generate import generate, pack
from engine.sampling import SamplingParams


def test_pack_pads_with_position_minus_one():
    ids, pos = pack([[7, 8, 9], [4]], [0, 5])
    assert ids.tolist() == [[7, 8, 9], [4, 0, 0]]
    assert pos.tolist() == [[0, 1, 2], [5, -1, -1]]


def test_seeded_sampling_is_the_same_with_and_without_a_cache(tiny):
    prompts = [[1, 2, 3], [9] * 11]
    params = [SamplingParams(temperature=0.8, top_k=50, max_tokens=6, seed=s, ignore_eos=True) for s in (1, 2)]
    cached = generate(tiny, prompts, params, cache=StaticKVCache(tiny.config, 2, 32))
    scratch = generate(tiny, prompts, params)
    assert [g.tokens for g in cached] == [g.tokens for g in scratch]
    assert all(len(g.tokens) == 6 for g in cached)


def test_stops_on_eos():
    greedy = SamplingParams(max_tokens=40)
    free_running = generate(tiny_model(seed=0), [[1, 2, 3]], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    eos = free_running.tokens[3]            # the same weights, with the 4th greedy token as end of sequence
    stopped = generate(tiny_model(seed=0, eos_token_id=eos), [[1, 2, 3]], greedy)[0]
    first = free_running.tokens.index(eos)
    assert stopped.tokens == free_running.tokens[:first + 1] and stopped.finish_reason == "stop"


def test_empty_prompt_is_refused(tiny):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(tiny, [[1], []])
    with pytest.raises(ValueError, match="2 prompts, 1 params"):
        generate(tiny, [[1], [2]], [SamplingParams()])


def test_cli_generate_is_the_same_through_every_cache():
    def run(cache):
        return subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt", "hi", "--prompt", "paged",
                               "--max-tokens", "4", "--temperature", "0.7", "--cache", cache],
                              capture_output=True, text=True, check=True).stdout
    outputs = [run(cache) for cache in ("none", "static", "paged")]
    assert outputs[0].startswith("'hi' -> ") and "4 tokens" in outputs[0]
    assert outputs[0] == outputs[1] == outputs[2]
    quantized = run("int8")             # int8 KV: its own rounding, so only the shape of the output is fixed
    assert quantized.startswith("'hi' -> ") and quantized.count("4 tokens") == 2


def test_from_scratch_rows_must_start_at_zero(tiny):
    import torch
    with pytest.raises(ValueError, match=r"row 1 has positions \[3, 4, -1\]"):
        tiny(torch.zeros(2, 3, dtype=torch.long), torch.tensor([[0, 1, 2], [3, 4, -1]]))
