"""`python -m engine bench-peer`: the engine against Hugging Face `transformers` on the same weights.

One random Qwen3 (seeded) is saved by `transformers` and loaded by the engine, so both run the same
weights. Each workload is served by `transformers`' `generate` (one static batch, left-padded, greedy,
the batch running until its longest request is done) and by the engine (continuous batching over a
paged cache, greedy). The outputs must be identical token for token; the JSON gives output tokens/s of
both and their ratio. Workloads: `batched` (32 prompts of 20-200 tokens, 64 new tokens each), `single`
(one 100-token prompt, 256 new tokens) and `sharegpt` (the vLLM paper's length mix, scaled down).

Like with like: the same threads for both, float32 both, and each side warmed up on a short request
before anything is timed (a first call pays for lazy imports and first allocations). Each workload is
served `--repeats` times each way, interleaved, and the medians are reported: wall clock, and the
process's CPU time, the steadier figure on a machine that others share.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time

import torch

from engine.errors import InputError

WORKLOADS = ("batched", "single", "sharegpt")
VOCAB, CONTEXT = 1024, 4096         # the random Qwen3's vocabulary and trained context (max_position_embeddings)
MAX_THREADS = 256
MAX_REPEATS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The random model's shape, the threads, the workloads' scale; each checked before anything is built."""
    from engine.tools import cli_args as check
    parser.epilog = ("Limits: --hidden, --layers, Q, KV and --token-budget are whole numbers >= 1; Q is a "
                     "multiple of KV and --hidden a multiple of Q with an even quotient (the head size, which "
                     f"RoPE rotates in pairs); --threads 1 to {MAX_THREADS}; --scale a finite number > 0 that keeps "
                     f"every request within the model's {CONTEXT}-token context; the model, held three times, "
                     "must fit in half the memory. A bad input prints one 'error: ...' line and "
                     "exits with status 2.")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS), action=check.Distinct,
                        help="which workloads to serve (each once)")
    parser.add_argument("--hidden", type=check.positive_int, default=256,
                        help="hidden size of the random Qwen3 (a multiple of Q; hidden / Q is even)")
    parser.add_argument("--layers", type=check.positive_int, default=4, help="decoder layers (>= 1)")
    parser.add_argument("--heads", type=check.positive_int, nargs=2, default=(8, 2), metavar=("Q", "KV"),
                        help="query and KV heads (>= 1; Q a multiple of KV)")
    parser.add_argument("--threads", type=check.int_in(1, MAX_THREADS), default=2,
                        help=f"torch threads for both (1 to {MAX_THREADS})")
    parser.add_argument("--scale", type=check.positive_float, default=1.0,
                        help="multiply every length (> 0; a quick run: 0.1; a length is at least 1 token)")
    parser.add_argument("--token-budget", type=check.positive_int, default=None,
                        help="the engine's tokens per step (>= 1; default: the scheduler's)")
    parser.add_argument("--seed", type=check.seed, default=0, help="weights and workload seed (0 to 2**63 - 1)")
    parser.add_argument("--repeats", type=check.int_in(1, MAX_REPEATS), default=3,
                        help=f"runs of each workload each way, interleaved; medians reported (1 to {MAX_REPEATS})")


def check_args(args) -> None:
    """Refuse a model shape the engine (or transformers) cannot build, or one too big for this machine."""
    from engine.tools.cli_args import check_memory
    from engine.config import ModelConfig
    from engine.tools.simulate import Roofline
    q_heads, kv_heads = args.heads
    if q_heads % kv_heads:
        raise InputError(f"--heads {q_heads} {kv_heads}: Q {q_heads} is not a multiple of KV {kv_heads} "
                         "(each KV head serves a whole group of query heads)")
    if args.hidden % q_heads or (args.hidden // q_heads) % 2:
        nearest = 2 * q_heads * max(1, round(args.hidden / 2 / q_heads))
        raise InputError(f"--hidden {args.hidden} with Q {q_heads} heads: the head size hidden / Q must be a whole, "
                         f"even number (RoPE rotates pairs of dimensions); try --hidden {nearest}")
    config = model_config(args, ModelConfig)
    weights = Roofline(config, None, dtype_bytes=4).weight_bytes
    check_memory(3 * weights, f"--hidden {args.hidden} x --layers {args.layers} (3 copies of "
                              f"{weights / 2**30:.2f} GiB of float32 weights)")


def model_config(args, config_class):
    """The random model's shape as `config_class` (transformers' Qwen3Config or the engine's ModelConfig)."""
    q_heads, kv_heads = args.heads
    fields = dict(vocab_size=VOCAB, hidden_size=args.hidden, num_attention_heads=q_heads,
                  num_key_value_heads=kv_heads, head_dim=args.hidden // q_heads, intermediate_size=3 * args.hidden,
                  max_position_embeddings=CONTEXT, tie_word_embeddings=False)
    if config_class.__name__ == "ModelConfig":
        return config_class.from_hf({**fields, "num_hidden_layers": args.layers})
    return config_class(num_hidden_layers=args.layers, **fields)


def workload(name: str, scale: float, seed: int, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt ids, new tokens) pairs of one named workload, fixed by the seed."""
    from engine.tools.workloads import check_mix, make_mix_workload, make_workload

    def scaled(n):
        return max(1, round(n * scale))
    if name == "batched":
        return make_workload(32, seed, (scaled(20), scaled(200)), (scaled(64), scaled(64)), vocab)
    if name == "single":
        rng = random.Random(seed)
        return [([rng.randrange(vocab) for _ in range(scaled(100))], scaled(256))]
    check_mix("sharegpt", scaled(1024), 0.5 * scale, f"--scale {scale:g}: the sharegpt workload's max_len "
              f"1024 x {scale:g} = {scaled(1024)}")
    return make_mix_workload(32, seed, "sharegpt", max_len=scaled(1024), scale=0.5 * scale, vocab=vocab)


def check_lengths(name: str, requests, scale: float) -> None:
    """Every request of the workload stays within the model's trained context."""
    longest = max(len(prompt) + new for prompt, new in requests)
    if longest - 1 > CONTEXT:
        raise InputError(f"--scale {scale:g}: the {name} workload's longest request needs {longest - 1} positions, "
                         f"past the model's trained context of {CONTEXT}: lower --scale")


def build_models(args, directory: str):
    """A seeded random Qwen3 in transformers, saved, and the same checkpoint loaded by the engine."""
    import transformers

    from engine.checkpoint import load_model
    config = model_config(args, transformers.Qwen3Config)
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


def timed(run, *args) -> tuple[list[list[int]], float, float]:
    """run(*args)'s outputs, its wall seconds (as it measured them) and this process's CPU seconds."""
    cpu = time.process_time()
    outputs, seconds = run(*args)
    return outputs, seconds, time.process_time() - cpu


def warm_up(theirs, ours, requests, token_budget) -> None:
    """Each side serves the workload's first prompt, cut to 8 tokens, for 2 new tokens, untimed."""
    prompt = requests[0][0][:8]
    run_transformers(theirs, [(prompt, 2)])
    run_engine(ours, [(prompt, 2)], token_budget)


def compare(name: str, requests, theirs, ours, token_budget, repeats: int = 1) -> dict:
    """Serve one workload both ways, `repeats` times each, interleaved (after a warm-up): median tokens/s,
    the ratios of the medians (wall clock and CPU time), and whether the outputs agree."""
    tokens = sum(new for _, new in requests)
    warm_up(theirs, ours, requests, token_budget)
    hf_runs, our_runs = [], []
    for _ in range(repeats):       # interleaved: a load that comes and goes falls on both sides
        hf_runs.append(timed(run_transformers, theirs, requests))
        our_runs.append(timed(run_engine, ours, requests, token_budget))
    hf_out, our_out = hf_runs[0][0], our_runs[0][0]
    hf_s, our_s = (statistics.median(run[1] for run in runs) for runs in (hf_runs, our_runs))
    hf_cpu, our_cpu = (statistics.median(run[2] for run in runs) for runs in (hf_runs, our_runs))
    differ = [i for i, (a, b) in enumerate(zip(hf_out, our_out)) if a != b]
    steady = all(run[0] == hf_out for run in hf_runs) and all(run[0] == our_out for run in our_runs)
    result = {"requests": len(requests), "prompt_tokens": sum(len(p) for p, _ in requests),
              "output_tokens": tokens, "repeats": repeats, "transformers_tokens_per_s": round(tokens / hf_s, 1),
              "engine_tokens_per_s": round(tokens / our_s, 1), "engine/transformers": round(hf_s / our_s, 3),
              "engine/transformers_cpu": round(hf_cpu / our_cpu, 3) if hf_cpu > 0 and our_cpu > 0 else None,
              "identical_outputs": not differ and steady}
    if differ:
        first = differ[0]
        position = next(i for i, (a, b) in enumerate(zip(hf_out[first], our_out[first])) if a != b)
        result["first_difference"] = (f"request {first} at output token {position}: transformers "
                                      f"{hf_out[first][position]}, engine {our_out[first][position]}")
    elif not steady:
        result["first_difference"] = "a repeated run's outputs differ from the same side's first run"
    print(f"{name:9s} transformers {result['transformers_tokens_per_s']:>8} tokens/s  engine "
          f"{result['engine_tokens_per_s']:>8} tokens/s  ratio {result['engine/transformers']} "
          f"(CPU time {result['engine/transformers_cpu']}, medians of {repeats})  "
          f"identical {result['identical_outputs']}", file=sys.stderr)
    return result


def main(args: argparse.Namespace) -> int:
    """Both ways on every workload; one JSON line on stdout; exit 1 if any output differs."""
    check_args(args)
    workloads = {name: workload(name, args.scale, args.seed, VOCAB) for name in args.workloads}
    for name, requests in workloads.items():
        check_lengths(name, requests, args.scale)
    torch.set_num_threads(args.threads)           # every check passed: now build and run
    with tempfile.TemporaryDirectory() as directory:
        theirs, ours = build_models(args, directory)
    results = {name: compare(name, requests, theirs, ours, args.token_budget, args.repeats)
               for name, requests in workloads.items()}
    print(json.dumps({"model": {"hidden": args.hidden, "layers": args.layers, "heads": list(args.heads)},
                      "threads": args.threads, "scale": args.scale, "workloads": results}))
    return 0 if all(r["identical_outputs"] for r in results.values()) else 1
