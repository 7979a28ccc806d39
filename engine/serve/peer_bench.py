"""`python -m engine bench-peer`: the engine against Hugging Face `transformers` on the same weights.

One random Qwen3 (seeded) is saved by `transformers` and loaded by the engine, so both run the same
weights. Each workload is served by `transformers`' `generate` (one static batch, left-padded, greedy,
the batch running until its longest request is done) and by the engine (continuous batching over a
paged cache, greedy). The outputs must be identical token for token; the JSON gives output tokens/s of
both and their ratio. Workloads: `batched` (32 prompts of 20-200 tokens, 64 new tokens each), `single`
(one 100-token prompt, 256 new tokens) and `sharegpt` (the vLLM paper's length mix, scaled down).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time

import torch

WORKLOADS = ("batched", "single", "sharegpt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the random Qwen3")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--heads", type=int, nargs=2, default=(8, 2), metavar=("Q", "KV"),
                        help="query and KV heads")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every length (a quick run: 0.1)")
    parser.add_argument("--token-budget", type=int, default=None,
                        help="the engine's tokens per step (default: the scheduler's)")
    parser.add_argument("--seed", type=int, default=0, help="weights and workload seed")


def workload(name: str, scale: float, seed: int, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt ids, new tokens) pairs of one named workload, fixed by the seed."""
    from engine.serve.workloads import make_mix_workload, make_workload

    def scaled(n):
        return max(1, round(n * scale))
    if name == "batched":
        return make_workload(32, seed, (scaled(20), scaled(200)), (scaled(64), scaled(64)), vocab)
    if name == "single":
        rng = random.Random(seed)
        return [([rng.randrange(vocab) for _ in range(scaled(100))], scaled(256))]
    return make_mix_workload(32, seed, "sharegpt", max_len=scaled(1024), scale=0.5 * scale, vocab=vocab)


def build_models(args, directory: str):
    """A seeded random Qwen3 in transformers, saved, and the same checkpoint loaded by the engine."""
    import transformers

    from engine.checkpoint import load_model
    q_heads, kv_heads = args.heads
    config = transformers.Qwen3Config(vocab_size=1024, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                      num_attention_heads=q_heads, num_key_value_heads=kv_heads,
                                      head_dim=args.hidden // q_heads, intermediate_size=3 * args.hidden,
                                      max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    theirs = transformers.Qwen3ForCausalLM(config).eval()
    theirs.save_pretrained(directory)
    return theirs, load_model(directory)


def run_transformers(model, requests) -> tuple[list[list[int]], float]:
    """One left-padded static batch through generate (greedy, no early stop); outputs and seconds."""
    width = max(len(prompt) for prompt, _ in requests)
    ids = torch.zeros(len(requests), width, dtype=torch.long)
    mask = torch.zeros(len(requests), width, dtype=torch.long)
    for row, (prompt, _) in enumerate(requests):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    longest = max(new for _, new in requests)
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    seconds = time.perf_counter() - started
    return [out[row, width:width + new].tolist() for row, (_, new) in enumerate(requests)], seconds


def run_engine(model, requests, token_budget: int | None) -> tuple[list[list[int]], float]:
    """Every request at once through the engine's continuous batching on a paged cache; outputs and seconds."""
    from engine.cache.paged import PagedKVCache
    from engine.cache.slots import blocks_needed
    from engine.sampling import SamplingParams
    from engine.serve.engine import Engine
    from engine.serve.scheduler import SchedulerConfig
    blocks = sum(blocks_needed(len(prompt) + new, 16) for prompt, new in requests) + 8
    cache = PagedKVCache(model.config, blocks, 16, dtype=torch.float32)
    config = SchedulerConfig() if token_budget is None else SchedulerConfig(max_batched_tokens=token_budget)
    engine = Engine(model, cache, config)
    started = time.perf_counter()
    added = [engine.add_request(prompt, SamplingParams(max_tokens=new, ignore_eos=True), seed=i)
             for i, (prompt, new) in enumerate(requests)]
    engine.run(progress=False)
    return [request.outputs[0] for request in added], time.perf_counter() - started


def compare(name: str, requests, theirs, ours, token_budget) -> dict:
    """Serve one workload both ways; tokens/s, the ratio, and whether the outputs agree."""
    tokens = sum(new for _, new in requests)
    hf_out, hf_s = run_transformers(theirs, requests)
    our_out, our_s = run_engine(ours, requests, token_budget)
    differ = [i for i, (a, b) in enumerate(zip(hf_out, our_out)) if a != b]
    result = {"requests": len(requests), "prompt_tokens": sum(len(p) for p, _ in requests),
              "output_tokens": tokens, "transformers_tokens_per_s": round(tokens / hf_s, 1),
              "engine_tokens_per_s": round(tokens / our_s, 1), "engine/transformers": round(hf_s / our_s, 3),
              "identical_outputs": not differ}
    if differ:
        first = differ[0]
        position = next(i for i, (a, b) in enumerate(zip(hf_out[first], our_out[first])) if a != b)
        result["first_difference"] = (f"request {first} at output token {position}: transformers "
                                      f"{hf_out[first][position]}, engine {our_out[first][position]}")
    print(f"{name:9s} transformers {result['transformers_tokens_per_s']:>8} tokens/s  engine "
          f"{result['engine_tokens_per_s']:>8} tokens/s  ratio {result['engine/transformers']}  "
          f"identical {result['identical_outputs']}", file=sys.stderr)
    return result


def main(args: argparse.Namespace) -> int:
    """Both ways on every workload; one JSON line on stdout; exit 1 if any output differs."""
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as directory:
        theirs, ours = build_models(args, directory)
    results = {name: compare(name, workload(name, args.scale, args.seed, ours.config.vocab_size), theirs, ours,
                             args.token_budget) for name in args.workloads}
    print(json.dumps({"model": {"hidden": args.hidden, "layers": args.layers, "heads": list(args.heads)},
                      "threads": args.threads, "scale": args.scale, "workloads": results}))
    return 0 if all(r["identical_outputs"] for r in results.values()) else 1
