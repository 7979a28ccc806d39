"""`python -m engine bench`: one workload, one scheduler, one KV budget in bytes, four ways to reserve.

Capacity mode (default) serves the same requests four times through the same Engine and Scheduler,
each time with the same number of KV bytes, reserved as
  max     a contiguous slot of the longest request length (StaticKVCache's policy, Orca "Max")
  pow2    a contiguous region of the true length rounded up to a power of two (Orca "Pow2")
  oracle  a contiguous region of exactly the true length (Orca "Oracle", not realisable)
  paged   16-token blocks taken as tokens arrive
and prints one JSON line: concurrency, KV utilization, preemptions, output tokens/s and ratios.
`--prefix` serves a shared-system-prompt workload with and without prefix caching instead.
`--simulate CONFIG --gpu NAME` swaps the tiny model for a roofline clock (see simulate.py).
"""
from __future__ import annotations

import argparse
import json
import random
import sys

import torch

from engine.sampling import SamplingParams
from engine.serve.contiguous import ContiguousKVCache
from engine.serve.engine import Engine
from engine.serve.scheduler import SchedulerConfig

KINDS = ("max", "pow2", "oracle", "paged")
REPORTED = ("concurrent_peak", "concurrent_mean", "concurrent_mean_saturated", "saturated_fraction",
            "kv_utilization_mean", "kv_pool_fill_mean", "preemptions_recompute", "preemptions_swap",
            "output_tokens_per_s", "ttft_mean_s", "elapsed_s", "steps", "output_tokens",
            "prompt_tokens_computed", "prefix_hit_rate", "prefix_tokens_saved")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options; every default is the documented workload (CPU defaults in brackets)."""
    parser.add_argument("--requests", type=int, default=None,
                        help="requests [256; simulated: 256, or twice what the paged pool holds "
                             "if more, which takes minutes for an 80 GB GPU]")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(20, 500), metavar=("MIN", "MAX"),
                        help="prompt tokens, uniform (before --scale)")
    parser.add_argument("--output-len", type=int, nargs=2, default=(10, 200), metavar=("MIN", "MAX"),
                        help="output tokens, uniform (before --scale); EOS is ignored")
    parser.add_argument("--scale", type=float, default=None,
                        help="multiply prompt/output lengths and --max-len [0.5 on CPU, 1 simulated]")
    parser.add_argument("--seed", type=int, default=0, help="the workload's seed")
    parser.add_argument("--max-len", type=int, default=1024, help="the Max policy's slot length")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per paged block")
    parser.add_argument("--slots", type=int, default=12,
                        help="CPU KV budget in Max slots: bytes = slots * max-len * KV bytes per token")
    parser.add_argument("--token-budget", type=int, default=None,
                        help="tokens per step [256; 8192 simulated]")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="which reservation policies to run")
    parser.add_argument("--prefix", action="store_true",
                        help="shared-system-prompt workload, prefix caching on vs off")
    parser.add_argument("--system-len", type=int, default=256, help="--prefix: shared prompt tokens")
    parser.add_argument("--simulate", metavar="CONFIG", help="a config.json path or name in engine/configs")
    parser.add_argument("--gpu", default="H100-80GB",
                        help="simulated GPU: H100-80GB, H200, A100-80GB (A100), A100-40GB, laptop-8GB")
    parser.add_argument("--plot", metavar="PATH", help="save KV fill and batch size over time")
    parser.add_argument("--quiet", action="store_true", help="no tqdm bars on stderr")


def make_workload(requests: int, seed: int, prompt_len=(20, 500), output_len=(10, 200),
                  vocab: int = 256) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) pairs, lengths uniform in the given ranges, fixed by the seed."""
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(*prompt_len))], rng.randint(*output_len))
            for _ in range(requests)]


def make_prefix_workload(requests: int, seed: int, system_len: int, vocab: int = 256):
    """Requests that share one system prompt, each followed by 16-64 tokens of its own; 16 outputs."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_len)]
    own = [[rng.randrange(vocab) for _ in range(rng.randint(16, 64))] for _ in range(requests)]
    return [(system + tokens, 16) for tokens in own]


class Setup:
    """What differs between a CPU run and a simulation: the model, its caches, its clock."""

    def __init__(self, args):
        """Build the model (or the roofline) and the KV budget in bytes from the command line."""
        self.simulated = bool(args.simulate)
        # On a CPU every length is halved by default: attention over a padded ragged batch costs
        # rows x new tokens x history, so this keeps the whole bench under two minutes; the ratios
        # barely move (the simulator, at full length, finds the same concurrency ratios).
        self.scale = args.scale or (1.0 if self.simulated else 0.5)
        self.prompt_len = tuple(max(1, round(n * self.scale)) for n in args.prompt_len)
        self.output_len = tuple(max(1, round(n * self.scale)) for n in args.output_len)
        self.max_len = max(1, round(args.max_len * self.scale))
        if self.simulated:
            from engine.serve import simulate
            gpu = simulate.GPUS.get(args.gpu)
            if gpu is None:
                raise ValueError(f"unknown --gpu {args.gpu!r}; known: {', '.join(simulate.GPUS)}")
            self.config = simulate.load_config(args.simulate)
            self.roofline = simulate.Roofline(self.config, gpu, name=args.simulate)
            self.model, self.bytes_per_token = None, self.roofline.kv_bytes_per_token
            self.budget = self.roofline.kv_budget_bytes()
            self.label = simulate.label(args.simulate, gpu)
        else:
            from engine.checkpoint import tiny_model
            torch.set_num_threads(1)           # a tiny model: threads only add contention
            # One layer and two query heads (over one KV head): a quarter of the tiny model's attention
            # work, which dominates on a CPU, where every row of a ragged batch is padded to the longest.
            self.model = tiny_model(num_layers=1, num_heads=2, num_kv_heads=1)
            self.config = self.model.config
            self.bytes_per_token = self.config.kv_bytes_per_token(torch.float32)
            self.budget = args.slots * self.max_len * self.bytes_per_token
            self.label = ("MEASURED on CPU, tiny seeded model cut to 1 layer and 2 heads, float32; lengths "
                          f"scaled by {self.scale:g}; KV budget = {args.slots} Max slots, so memory binds. "
                          "A CPU is compute-bound and pays for padding, so a bigger batch buys concurrency, "
                          "not tokens/s: see --simulate for throughput on a GPU")
        self.args = args

    def engine(self, kind: str, prefix_caching: bool = True) -> Engine:
        """A fresh Engine whose cache spends exactly the budget's bytes the `kind` way."""
        args, tokens = self.args, self.budget // self.bytes_per_token
        token_budget = args.token_budget or (8192 if self.simulated else 256)
        config = SchedulerConfig(max_num_seqs=4096, max_batched_tokens=token_budget)
        if kind == "paged":
            blocks = tokens // args.block_size
            if self.simulated:
                from engine.serve.simulate import BookkeepingPagedCache
                cache = BookkeepingPagedCache(blocks, args.block_size)
            else:
                from engine.cache.paged import PagedKVCache
                cache = PagedKVCache(self.config, blocks, args.block_size)
        else:
            cache = ContiguousKVCache(self.config, tokens, kind, self.max_len, store=not self.simulated)
        runner = None
        if self.simulated:
            from engine.serve.simulate import SimulatedRunner
            runner = SimulatedRunner(self.roofline, cache)
        return Engine(self.model, cache, config, prefix_caching=prefix_caching, runner=runner)


def serve(engine: Engine, workload, progress: bool | None, desc: str = "requests") -> dict:
    """Add every request at time 0 (greedy, fixed lengths), run to the end, summarise."""
    for index, (prompt, outputs) in enumerate(workload):
        engine.add_request(prompt, SamplingParams(max_tokens=outputs, ignore_eos=True), seed=index)
    engine.run(progress=progress, desc=desc)
    summary = engine.metrics.summary(engine)
    report = {key: summary[key] for key in REPORTED}
    if hasattr(engine.runner, "time_split"):
        report.update(engine.runner.time_split())
    return report


def ratio(a, b):
    """a / b rounded, or None when b is zero."""
    return round(a / b, 3) if b else None


def capacity(setup: Setup, args) -> dict:
    """Capacity mode: the four reservation policies on one workload and one byte budget."""
    requests = args.requests or 256
    if setup.simulated and not args.requests:
        # Enough requests to keep a big pool full for most of the run, or nothing binds.
        live = sum(setup.prompt_len) / 2 + sum(setup.output_len) / 4 + args.block_size / 2
        requests = max(256, 2 * int(setup.budget // setup.bytes_per_token / live))
    workload = make_workload(requests, args.seed, setup.prompt_len, setup.output_len)
    runs, metrics = {}, {}
    for kind in args.kinds:
        engine = setup.engine(kind)
        runs[kind] = serve(engine, workload, False if args.quiet else None, kind)
        metrics[kind] = engine.metrics
    ratios = {}
    if "paged" in runs:
        for kind in [k for k in KINDS if k in runs and k != "paged"]:
            ratios[f"paged/{kind}"] = {key: ratio(runs["paged"][key], runs[kind][key]) for key in
                                       ("concurrent_mean_saturated", "concurrent_mean", "concurrent_peak",
                                        "kv_utilization_mean", "output_tokens_per_s")}
    if args.plot and "paged" in metrics:
        other = "max" if "max" in metrics else None
        title = "SIMULATED (roofline)" if setup.simulated else "MEASURED on CPU (tiny model)"
        metrics["paged"].plot(args.plot, f"{title}: same KV bytes, paged vs {other}", metrics.get(other),
                              ("paged", other or ""))
    return {"mode": "capacity", "simulation": setup.simulated, "label": setup.label,
            "workload": {"requests": requests, "prompt_len": list(setup.prompt_len),
                         "output_len": list(setup.output_len), "seed": args.seed, "scale": setup.scale},
            "kv_budget_bytes": setup.budget, "kv_bytes_per_token": setup.bytes_per_token,
            "block_size": args.block_size, "max_len": setup.max_len, "runs": runs, "ratios": ratios,
            **({"constants": setup.roofline.constants()} if setup.simulated else {})}


def prefix(setup: Setup, args) -> dict:
    """Prefix mode: the same shared-prompt requests on the paged cache, prefix caching on and off."""
    requests = args.requests or 64
    workload = make_prefix_workload(requests, args.seed, args.system_len)
    runs, metrics = {}, {}
    for name, enabled in (("prefix_on", True), ("prefix_off", False)):
        engine = setup.engine("paged", prefix_caching=enabled)
        runs[name] = serve(engine, workload, False if args.quiet else None, name)
        metrics[name] = engine.metrics
    if args.plot:
        metrics["prefix_on"].plot(args.plot, "prefix caching", metrics["prefix_off"], ("on", "off"))
    on, off = runs["prefix_on"], runs["prefix_off"]
    return {"mode": "prefix", "simulation": setup.simulated, "label": setup.label,
            "workload": {"requests": requests, "system_len": args.system_len, "own_len": [16, 64],
                         "output_len": 16, "seed": args.seed},
            "runs": runs,
            "ratios": {"prompt_tokens_computed on/off": ratio(on["prompt_tokens_computed"],
                                                              off["prompt_tokens_computed"]),
                       "ttft_mean on/off": ratio(on["ttft_mean_s"], off["ttft_mean_s"])}}


def main(args: argparse.Namespace) -> int:
    """Run the chosen mode and print its result as one JSON line on stdout."""
    try:
        setup = Setup(args)
    except (ValueError, FileNotFoundError) as error:     # a model that does not fit, an unknown config
        print(f"bench: {error}", file=sys.stderr)
        return 2
    result = prefix(setup, args) if args.prefix else capacity(setup, args)
    print(json.dumps(result), file=sys.stdout, flush=True)
    return 0
