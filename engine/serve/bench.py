"""`python -m engine bench`: one workload, one scheduler, one KV budget in bytes, four ways to reserve.

Capacity mode (default) serves the same requests four times through the same Engine and Scheduler,
each time with the same number of KV bytes, reserved as
  max     a contiguous slot of the longest request length (StaticKVCache's policy, Orca "Max")
  pow2    a contiguous region of the true length rounded up to a power of two (Orca "Pow2")
  oracle  a contiguous region of exactly the true length (Orca "Oracle", not realisable)
  paged   16-token blocks taken as tokens arrive
and prints one JSON line on stdout (concurrency, KV utilization, preemptions, output tokens/s, ratios)
and a short human summary on stderr, which says whether paged/Max throughput lands in the vLLM paper's
2-4x band and why or why not.
`--workload sharegpt|alpaca` swaps the uniform lengths for the paper's length mixes, and
`--request-rate R` makes requests arrive as a Poisson process (the paper's setting) instead of all at 0.
`--prefix` serves a shared-system-prompt workload with and without prefix caching instead.
`--simulate CONFIG --gpu NAME` swaps the tiny model for a roofline clock (see simulate.py).
`--device cuda [--model-config CONFIG]` runs the real engine on a GPU and prints the simulation's
prediction for that card (detected, or `--gpu NAME`) next to what it measured.
Measured figures and why they land where they do: engine/serve/README.md.
"""
from __future__ import annotations

import argparse
import json
import math
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
            "output_tokens_per_s", "requests_per_s", "normalized_latency_s_per_token", "ttft_mean_s",
            "elapsed_s", "steps", "output_tokens", "prompt_tokens_computed", "prefix_hit_rate",
            "prefix_tokens_saved")
# The vLLM paper's (Kwon et al., SOSP 2023, section 6.1) datasets: mean prompt and output tokens.
MIXES = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}
MIX_SIGMA = 0.8              # lognormal spread of the synthetic mixes: long-tailed, as in the paper's fig. 11
PAPER_BAND = (2.0, 4.0)      # paged/Orca throughput the paper reports (2-4x; up to 22x over HF/FT is others)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options; every default is the documented workload (CPU defaults in brackets)."""
    parser.add_argument("--requests", type=int, default=None,
                        help="requests [256; simulated: 256, or twice what the paged pool holds "
                             "if more, which takes minutes for an 80 GB GPU]")
    parser.add_argument("--workload", choices=("uniform",) + tuple(MIXES), default="uniform",
                        help="uniform: --prompt-len/--output-len; sharegpt/alpaca: synthetic lognormal "
                             "lengths with the vLLM paper's means (ShareGPT 161 in/338 out, output-heavy; "
                             "Alpaca 19 in/58 out), pairs longer than --max-len redrawn")
    parser.add_argument("--request-rate", type=float, default=None, metavar="REQ_PER_S",
                        help="Poisson arrivals at this rate on the engine clock [all requests at time 0]")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(20, 500), metavar=("MIN", "MAX"),
                        help="prompt tokens, uniform (before --scale)")
    parser.add_argument("--output-len", type=int, nargs=2, default=(10, 200), metavar=("MIN", "MAX"),
                        help="output tokens, uniform (before --scale); EOS is ignored")
    parser.add_argument("--scale", type=float, default=None,
                        help="multiply the capacity workload's lengths and --max-len "
                             "[0.5 on CPU, 1 simulated or on CUDA]; the --prefix workload is not scaled")
    parser.add_argument("--seed", type=int, default=0, help="the workload's seed")
    parser.add_argument("--max-len", type=int, default=1024, help="the Max policy's slot length")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per paged block")
    parser.add_argument("--slots", type=int, default=12,
                        help="real-run KV budget in Max slots: bytes = slots * max-len * KV bytes per token")
    parser.add_argument("--token-budget", type=int, default=None,
                        help="tokens per step [256 on CPU; 8192 simulated or on CUDA]")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="which reservation policies to run")
    parser.add_argument("--prefix", action="store_true",
                        help="shared-system-prompt workload, prefix caching on vs off")
    parser.add_argument("--system-len", type=int, default=256, help="--prefix: shared prompt tokens")
    parser.add_argument("--simulate", metavar="CONFIG", help="a config.json path or name in engine/configs")
    parser.add_argument("--gpu", default=None,
                        help="GPU of the roofline: H100-80GB, H200, A100-80GB (A100), A100-40GB, laptop-8GB "
                             "[--simulate: H100-80GB; --device cuda: the detected card]")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the real (not simulated) run executes")
    parser.add_argument("--model-config", metavar="CONFIG", default=None,
                        help="real run: a model of this config's shape with random weights (e.g. qwen3-0.6b) "
                             "[the tiny model cut to 1 layer and 2 heads]")
    parser.add_argument("--plot", metavar="PATH", help="save KV fill and batch size over time")
    parser.add_argument("--quiet", action="store_true", help="no tqdm bars on stderr")


def make_workload(requests: int, seed: int, prompt_len=(20, 500), output_len=(10, 200),
                  vocab: int = 256) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) pairs, lengths uniform in the given ranges, fixed by the seed."""
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(*prompt_len))], rng.randint(*output_len))
            for _ in range(requests)]


def make_mix_workload(requests: int, seed: int, mix: str, max_len: int, scale: float = 1.0,
                      vocab: int = 256) -> list[tuple[list[int], int]]:
    """The vLLM paper's length mixes, synthesised: lognormal prompt and output lengths with the dataset's
    means (times `scale`). A pair longer than `max_len` is redrawn, as vLLM's benchmark drops over-long
    pairs; the lognormals are first calibrated (on a separate sample) so that the means survive that
    cut, and the JSON reports the means actually drawn."""
    targets = [m * scale for m in MIXES[mix]]
    mus = [math.log(m) - MIX_SIGMA ** 2 / 2 for m in targets]    # E[lognormal] = exp(mu + sigma^2 / 2)
    for _ in range(4):                                           # fixed point: drawn means -> targets
        calibration = random.Random(seed + 7)
        sample = [mix_lengths(calibration, mus, max_len) for _ in range(2048)]
        mus = [mu + math.log(target / (sum(pair[i] for pair in sample) / len(sample)))
               for i, (mu, target) in enumerate(zip(mus, targets))]
    rng = random.Random(seed)
    pairs = []
    for _ in range(requests):
        prompt, output = mix_lengths(rng, mus, max_len)
        pairs.append(([rng.randrange(vocab) for _ in range(prompt)], output))
    return pairs


def mix_lengths(rng: random.Random, mus: list[float], max_len: int) -> tuple[int, int]:
    """One (prompt, output) pair of lognormal lengths that fits in max_len (redrawn until it does)."""
    while True:
        prompt, output = (max(1, round(rng.lognormvariate(mu, MIX_SIGMA))) for mu in mus)
        if prompt + output <= max_len:
            return prompt, output


def arrival_times(requests: int, rate: float | None, seed: int) -> list[float] | None:
    """Poisson arrivals (exponential gaps, mean 1/rate seconds), or None: every request at time 0."""
    if rate is None:
        return None
    if rate <= 0:
        raise ValueError(f"--request-rate must be positive, got {rate}")
    rng, now, times = random.Random(seed + 1), 0.0, []
    for _ in range(requests):
        now += rng.expovariate(rate)
        times.append(now)
    return times


def make_prefix_workload(requests: int, seed: int, system_len: int, vocab: int = 256):
    """Requests that share one system prompt, each followed by 16-64 tokens of its own; 16 outputs."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_len)]
    own = [[rng.randrange(vocab) for _ in range(rng.randint(16, 64))] for _ in range(requests)]
    return [(system + tokens, 16) for tokens in own]


def check_device(device: str) -> None:
    """Fail with a clear message when the asked-for device is not there."""
    if device == "cuda" and not torch.cuda.is_available():
        built = torch.version.cuda
        raise ValueError("--device cuda: no CUDA device is available here (torch "
                         f"{torch.__version__}, "
                         f"{'built for CUDA ' + built if built else 'a CPU-only build'}); "
                         "run it on a GPU machine, or use --device cpu or --simulate CONFIG --gpu NAME")


def random_model(config, device: str, dtype: torch.dtype, seed: int = 0):
    """A model of `config`'s shape with seeded random weights (PyTorch's default init), built on `device`."""
    from engine.model import Qwen3Model
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3Model(config)
    return model.to(dtype).eval()


class Setup:
    """What differs between a CPU run, a GPU run and a simulation: the model, its caches, its clock."""

    def __init__(self, args, simulate_as: tuple | None = None, budget: int | None = None):
        """Build the model (or the roofline) and the KV budget in bytes from the command line.

        `simulate_as=(config, name, gpu)` with `budget` builds the simulation that predicts a real GPU run.
        """
        self.args = args
        self.simulated = bool(args.simulate) or simulate_as is not None
        self.device = "cpu" if self.simulated else args.device
        # On a CPU every length is halved by default: attention over a padded ragged batch costs
        # rows x new tokens x history, so this keeps the whole bench under two minutes; the ratios
        # barely move (the simulator, at full length, finds the same concurrency ratios).
        self.scale = args.scale or (0.5 if self.device == "cpu" and not self.simulated else 1.0)
        self.prompt_len = tuple(max(1, round(n * self.scale)) for n in args.prompt_len)
        self.output_len = tuple(max(1, round(n * self.scale)) for n in args.output_len)
        self.max_len = max(1, round(args.max_len * self.scale))
        if self.simulated:
            from engine.serve import simulate
            config, config_name, gpu_name = simulate_as or (None, args.simulate, args.gpu or "H100-80GB")
            gpu = simulate.GPUS.get(gpu_name)
            if gpu is None:
                raise ValueError(f"unknown --gpu {gpu_name!r}; known: {', '.join(simulate.GPUS)}")
            self.config = config or simulate.load_config(config_name)
            self.roofline = simulate.Roofline(self.config, gpu, name=config_name)
            self.model, self.bytes_per_token = None, self.roofline.kv_bytes_per_token
            self.budget = budget if budget is not None else self.roofline.kv_budget_bytes()
            self.label = simulate.label(config_name, gpu)
            return
        check_device(self.device)
        if args.gpu is not None:
            from engine.serve.simulate import GPUS
            if args.gpu not in GPUS:
                raise ValueError(f"unknown --gpu {args.gpu!r}; known: {', '.join(GPUS)}")
        if self.device == "cpu":
            torch.set_num_threads(1)           # a tiny model: threads only add contention
        self.dtype = torch.float32 if self.device == "cpu" else torch.bfloat16
        if args.model_config:
            from engine.config import known_config
            self.config = known_config(args.model_config)
            self.model = random_model(self.config, self.device, self.dtype)
            what = f"{args.model_config}-shaped model with random weights"
        else:
            from engine.checkpoint import tiny_model
            # One layer and two query heads (over one KV head): a quarter of the tiny model's attention
            # work, which dominates on a CPU, where every row of a ragged batch is padded to the longest.
            self.model = tiny_model(num_layers=1, num_heads=2, num_kv_heads=1).to(self.device, self.dtype)
            self.config = self.model.config
            what = "tiny seeded model cut to 1 layer and 2 heads"
        self.bytes_per_token = self.config.kv_bytes_per_token(self.dtype)
        self.budget = args.slots * self.max_len * self.bytes_per_token
        dtype = str(self.dtype).removeprefix("torch.")
        budget = f"KV budget = {args.slots} Max slots of {self.max_len} tokens"
        if not args.prefix:
            budget += ", so memory binds"
        if self.device == "cuda":
            card = torch.cuda.get_device_name()
            self.label = (f"MEASURED on {card}, {what}, {dtype}; {budget}. Eager PyTorch on padded ragged "
                          "batches: the roofline prediction printed next to it is an upper bound")
        elif args.prefix:
            self.label = (f"MEASURED on CPU, {what}, {dtype}; prefix workload as given "
                          f"({args.system_len}-token system prompt, 16-64 own tokens, 16 outputs; --scale "
                          f"does not apply to it); {budget}")
        else:
            self.label = (f"MEASURED on CPU, {what}, {dtype}; lengths scaled by {self.scale:g}; {budget}. "
                          "A CPU is compute-bound and pays for padding, so a bigger batch buys concurrency, "
                          "not tokens/s: see --simulate for throughput on a GPU")

    def engine(self, kind: str, prefix_caching: bool = True) -> Engine:
        """A fresh Engine whose cache spends exactly the budget's bytes the `kind` way."""
        args, tokens = self.args, self.budget // self.bytes_per_token
        token_budget = args.token_budget or (256 if self.device == "cpu" and not self.simulated else 8192)
        config = SchedulerConfig(max_num_seqs=4096, max_batched_tokens=token_budget)
        if kind == "paged":
            blocks = tokens // args.block_size
            if self.simulated:
                from engine.serve.simulate import BookkeepingPagedCache
                cache = BookkeepingPagedCache(blocks, args.block_size)
            else:
                from engine.cache.paged import PagedKVCache
                cache = PagedKVCache(self.config, blocks, args.block_size, dtype=self.dtype,
                                     device=self.device)
        elif self.simulated:
            cache = ContiguousKVCache(self.config, tokens, kind, self.max_len, store=False)
        else:
            cache = ContiguousKVCache(self.config, tokens, kind, self.max_len, dtype=self.dtype,
                                      device=self.device)
        runner = None
        if self.simulated:
            from engine.serve.simulate import SimulatedRunner
            runner = SimulatedRunner(self.roofline, cache)
        return Engine(self.model, cache, config, prefix_caching=prefix_caching, runner=runner)


def serve(engine: Engine, workload, progress: bool | None, desc: str = "requests",
          arrivals: list[float] | None = None) -> dict:
    """Serve the workload (greedy, fixed lengths) to the end, summarise.

    Without `arrivals` every request is added at time 0; with them, request i joins the queue once the
    engine clock reaches arrivals[i] (an idle engine skips ahead to the next arrival).
    """
    def add(index):
        prompt, outputs = workload[index]
        return engine.add_request(prompt, SamplingParams(max_tokens=outputs, ignore_eos=True), seed=index)

    if arrivals is None:
        for index in range(len(workload)):
            add(index)
        engine.run(progress=progress, desc=desc)
    else:
        bar = None
        if progress or (progress is None and len(workload) >= 64):
            from tqdm import tqdm
            bar = tqdm(total=len(workload), desc=desc, unit="req", leave=False)
        upcoming = 0
        while upcoming < len(workload) or engine.has_unfinished():
            if not engine.has_unfinished() and arrivals[upcoming] > engine.now:
                engine.now = arrivals[upcoming]          # idle: nothing to do until the next arrival
            while upcoming < len(workload) and arrivals[upcoming] <= engine.now:
                add(upcoming).arrival = arrivals[upcoming]   # latency counts from the true arrival
                upcoming += 1
            for seq in engine.step():
                if bar is not None and seq.request.finished:
                    bar.update(1)
        if bar is not None:
            bar.close()
    summary = engine.metrics.summary(engine)
    report = {key: summary[key] for key in REPORTED}
    if hasattr(engine.runner, "time_split"):
        report.update(engine.runner.time_split())
    return report


def ratio(a, b):
    """a / b rounded, or None when b is zero (or either is missing)."""
    return round(a / b, 3) if a is not None and b else None


def capacity_workload(setup: Setup, args):
    """The capacity mode's requests, arrival times, and a description of both for the JSON."""
    if args.workload == "uniform":
        prompt_mean, output_mean = sum(setup.prompt_len) / 2, sum(setup.output_len) / 2
    else:
        prompt_mean, output_mean = (m * setup.scale for m in MIXES[args.workload])
    requests = args.requests or 256
    if setup.simulated and not args.requests:
        # Enough requests to keep a big pool full for most of the run, or nothing binds.
        live = prompt_mean + output_mean / 2 + args.block_size / 2
        requests = max(256, 2 * int(setup.budget // setup.bytes_per_token / live))
    if args.workload == "uniform":
        workload = make_workload(requests, args.seed, setup.prompt_len, setup.output_len)
        shape = {"prompt_len": list(setup.prompt_len), "output_len": list(setup.output_len)}
    else:
        workload = make_mix_workload(requests, args.seed, args.workload, setup.max_len, setup.scale)
        shape = {"lengths": f"lognormal (sigma {MIX_SIGMA}), paper means x {setup.scale:g}: prompt "
                            f"{prompt_mean:g}, output {output_mean:g}; pairs over max_len redrawn, "
                            "calibrated to keep the means"}
    arrivals = arrival_times(requests, args.request_rate, args.seed)
    description = {"name": args.workload, "requests": requests, **shape,
                   "prompt_mean": round(sum(len(p) for p, _ in workload) / requests, 1),
                   "output_mean": round(sum(o for _, o in workload) / requests, 1),
                   "arrivals": (f"Poisson, {args.request_rate:g} req/s" if arrivals else "all at time 0"),
                   "seed": args.seed, "scale": setup.scale}
    return workload, arrivals, description


def run_kinds(setup: Setup, args, workload, arrivals, progress=None):
    """Serve the workload once per reservation policy; (reports, metrics) by kind."""
    runs, metrics = {}, {}
    for kind in args.kinds:
        engine = setup.engine(kind)
        runs[kind] = serve(engine, workload, progress, kind, arrivals)
        metrics[kind] = engine.metrics
    return runs, metrics


def paged_ratios(runs: dict) -> dict:
    """paged over each other policy, for the figures that paging should move."""
    ratios = {}
    if "paged" in runs:
        for kind in [k for k in KINDS if k in runs and k != "paged"]:
            ratios[f"paged/{kind}"] = {key: ratio(runs["paged"][key], runs[kind][key]) for key in
                                       ("concurrent_mean_saturated", "concurrent_mean", "concurrent_peak",
                                        "kv_utilization_mean", "output_tokens_per_s")}
    return ratios


def paper_band(setup: Setup, runs: dict, ratios: dict, workload: dict,
               rate: float | None = None) -> dict | None:
    """Does paged/Max throughput land in the vLLM paper's 2-4x, and why (or why not)?

    Paging turns memory into concurrency; concurrency turns into tokens/s only while a step costs about
    the same whatever its batch, i.e. while it is memory-bound on reading the weights. Compute-bound
    steps (prefill, or a CPU) and KV-dominated traffic (big batches of long sequences) grow with the
    batch, so the extra sequences are not free. With Poisson arrivals, throughput is capped by the
    offered load; the paper's gain is the highest rate each system sustains at a bounded normalized
    latency, so the verdict then also compares normalized latency.
    """
    if "paged/max" not in ratios:
        return None
    low, high = PAPER_BAND
    throughput = ratios["paged/max"]["output_tokens_per_s"]
    static, paged = runs["max"], runs["paged"]
    # Sequences held while requests queue; a paged run that never queued is compared on its plain mean.
    concurrency = ratios["paged/max"]["concurrent_mean_saturated" if paged["saturated_fraction"] else
                                      "concurrent_mean"]
    all_at_once = rate is None
    verdict = {"paged/max_output_tokens_per_s": throughput, "band": list(PAPER_BAND),
               "in_band": throughput is not None and low <= throughput <= high,
               "paged/max_concurrency": concurrency,
               "concurrency_basis": ("concurrent_mean_saturated" if paged["saturated_fraction"] else
                                     "concurrent_mean (the paged run never queued)"),
               "max_concurrent_mean_saturated": static["concurrent_mean_saturated"],
               "max_saturated_fraction": static["saturated_fraction"]}
    reasons = []
    if not all_at_once:
        offered = rate * workload["output_mean"]
        verdict["offered_output_tokens_per_s"] = round(offered, 2)
        verdict["max/paged_normalized_latency"] = ratio(static["normalized_latency_s_per_token"],
                                                        paged["normalized_latency_s_per_token"])
        kept_up = [name for name, run in (("paged", paged), ("Max", static))
                   if run["output_tokens_per_s"] >= 0.8 * offered]
        if kept_up:
            reasons.append(f"{' and '.join(kept_up)} kept up with the offered load ({rate:g} req/s x "
                           f"{workload['output_mean']:g} output tokens = {offered:.0f} tokens/s), so "
                           "tokens/s measures the load, not the capacity")
        reasons.append(f"normalized latency (the paper's metric at a fixed rate) is "
                       f"{verdict['max/paged_normalized_latency']}x lower paged than Max")
    if not setup.simulated:
        where = "in" if verdict["in_band"] else "outside"
        verdict["why"] = (f"{throughput}x is {where} the band, but the band is a GPU figure: this run is "
                          f"measured on {setup.device.upper()}"
                          + (", where every step is compute-bound and padded, so paging's "
                             f"{concurrency}x concurrency does not become tokens/s"
                             if setup.device == "cpu" else "") + "".join(f"; {r}" for r in reasons))
        return verdict
    for name, run in (("max", static), ("paged", paged)):
        verdict[f"{name}_compute_bound_fraction"] = run["compute_bound_fraction"]
        verdict[f"{name}_kv_share_of_bytes"] = run["kv_share_of_bytes"]
    if not paged["saturated_fraction"]:
        reasons.append(f"the paged run never queued a request (it held up to {paged['concurrent_peak']} "
                       f"sequences, {concurrency}x Max's mean)")
    elif concurrency is not None and concurrency < low:
        reasons.append(f"paging holds only {concurrency}x as many sequences as Max slots (Max already fits "
                       f"{static['concurrent_mean_saturated']:g} at a time in {setup.budget / 1e9:.1f} GB "
                       f"of KV at {setup.bytes_per_token / 1024:g} KiB/token), so there is little "
                       "concurrency to gain")
    elif concurrency is not None and concurrency > high:
        reasons.append(f"paging holds {concurrency}x as many sequences as Max slots: the Max reservation "
                       "wastes more than the paper's workloads did")
    else:
        reasons.append(f"paging holds {concurrency}x as many sequences as Max slots")
    compute = static["compute_bound_fraction"]
    if compute >= 0.25:
        reasons.append(f"{compute:.0%} of the Max run's modelled time is compute-bound (prefill"
                       f"{', every prompt arriving at t=0' if all_at_once else ''}), where a step costs in "
                       "proportion to its tokens and a bigger batch buys nothing")
    kv_share = paged["kv_share_of_bytes"]
    if kv_share >= 0.5:
        reasons.append(f"{kv_share:.0%} of the paged run's HBM bytes are KV reads, which grow with the "
                       "batch: only the weight reads are shared by extra sequences")
    elif compute < 0.25:
        reasons.append(f"steps are mostly memory-bound on the weights ({1 - kv_share:.0%} of the paged run's "
                       "bytes), so extra sequences ride along almost free")
    preempted = paged["preemptions_recompute"] + paged["preemptions_swap"]
    if preempted and paged["compute_bound_fraction"] + paged["swapping_fraction"] > compute + 0.03:
        reasons.append(f"the paged run preempted {preempted} times (recompute "
                       f"{paged['preemptions_recompute']}, swap {paged['preemptions_swap']}): with replayed "
                       "prefills, swaps and bigger batches, "
                       f"{paged['compute_bound_fraction'] + paged['swapping_fraction']:.0%} of its time is "
                       f"compute-bound or swapping, against {compute:.0%} for Max")
    if static["saturated_fraction"] < 0.5:
        reasons.append(f"the Max run had a queue in only {static['saturated_fraction']:.0%} of its steps: "
                       "memory rarely bound")
    if 0 < paged["saturated_fraction"] < 0.25:
        reasons.append(f"the paged run had a queue in only {paged['saturated_fraction']:.0%} of its steps "
                       f"(peak {paged['concurrent_peak']} sequences): its pool rarely filled, so more "
                       "requests would raise its concurrency")
    below = throughput is not None and throughput < low
    where = "in" if verdict["in_band"] else ("below" if below else "above")
    verdict["why"] = f"{throughput}x is {where} the paper's {low:g}-{high:g}x: " + "; ".join(reasons)
    return verdict


def predict(setup: Setup, args, workload, arrivals) -> dict:
    """The simulation's prediction for this card: same config, workload and KV bytes, roofline clock."""
    from engine.serve.simulate import gpu_for_device_name
    card = torch.cuda.get_device_name()
    gpu = args.gpu or gpu_for_device_name(card)
    if gpu is None:
        return {"skipped": f"no roofline for {card!r}: pass --gpu NAME to pick the closest"}
    name = args.model_config or "the tiny model (1 layer, 2 heads)"
    sim = Setup(args, simulate_as=(setup.config, name, gpu), budget=setup.budget)
    runs, _ = run_kinds(sim, args, workload, arrivals, progress=False)
    keys = ("output_tokens_per_s", "concurrent_mean_saturated", "ttft_mean_s", "elapsed_s",
            "compute_bound_fraction", "kv_share_of_bytes")
    return {"label": sim.label, "card": card, "gpu": gpu, "constants": sim.roofline.constants(),
            "runs": {kind: {key: run[key] for key in keys} for kind, run in runs.items()},
            "ratios": paged_ratios(runs)}


def capacity(setup: Setup, args) -> dict:
    """Capacity mode: the four reservation policies on one workload and one byte budget."""
    workload, arrivals, description = capacity_workload(setup, args)
    runs, metrics = run_kinds(setup, args, workload, arrivals, False if args.quiet else None)
    ratios = paged_ratios(runs)
    if args.plot and "paged" in metrics:
        other = "max" if "max" in metrics else None
        title = ("SIMULATED (roofline)" if setup.simulated else
                 f"MEASURED on {setup.device.upper()} ({args.model_config or 'tiny model'})")
        metrics["paged"].plot(args.plot, f"{title}: same KV bytes, paged vs {other}", metrics.get(other),
                              ("paged", other or ""))
    result = {"mode": "capacity", "simulation": setup.simulated, "device": setup.device, "label": setup.label,
              "workload": description, "kv_budget_bytes": setup.budget,
              "kv_bytes_per_token": setup.bytes_per_token, "block_size": args.block_size,
              "max_len": setup.max_len, "runs": runs, "ratios": ratios,
              "paper_band": paper_band(setup, runs, ratios, description, args.request_rate)}
    if setup.simulated:
        result["constants"] = setup.roofline.constants()
    if setup.device == "cuda":
        result["prediction"] = predict(setup, args, workload, arrivals)
        if "runs" in result["prediction"]:
            result["measured/predicted_output_tokens_per_s"] = {
                kind: ratio(runs[kind]["output_tokens_per_s"], run["output_tokens_per_s"])
                for kind, run in result["prediction"]["runs"].items()}
    return result


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
    return {"mode": "prefix", "simulation": setup.simulated, "device": setup.device, "label": setup.label,
            "workload": {"requests": requests, "system_len": args.system_len, "own_len": [16, 64],
                         "output_len": 16, "seed": args.seed, "scaled": False},
            "runs": runs,
            "ratios": {"prompt_tokens_computed on/off": ratio(on["prompt_tokens_computed"],
                                                              off["prompt_tokens_computed"]),
                       "ttft_mean on/off": ratio(on["ttft_mean_s"], off["ttft_mean_s"])}}


def summary_lines(result: dict) -> list[str]:
    """The human summary (stderr): what was run, one line per policy, the ratios and the verdict."""
    lines = [result["label"]]
    workload = result["workload"]
    if result["mode"] == "capacity":
        lines.append(f"workload {workload['name']}: {workload['requests']} requests, mean prompt "
                     f"{workload['prompt_mean']:g}, mean output {workload['output_mean']:g} tokens, "
                     f"arrivals {workload['arrivals']}")
    for kind, run in result["runs"].items():
        lines.append(f"  {kind:10s} tokens/s {run['output_tokens_per_s']:>10g}  concurrent mean "
                     f"{run['concurrent_mean_saturated']:>7g} (peak {run['concurrent_peak']})  ttft "
                     f"{run['ttft_mean_s']}s  latency/token {run['normalized_latency_s_per_token']}s  "
                     f"preempted {run['preemptions_recompute'] + run['preemptions_swap']}")
    for name, values in result["ratios"].items():
        lines.append(f"  {name}: {values}")
    band = result.get("paper_band")
    if band:
        lines.append(f"paper band ({'IN' if band['in_band'] else 'NOT in'} 2-4x): {band['why']}")
    prediction = result.get("prediction")
    if prediction:
        if "skipped" in prediction:
            lines.append(f"prediction: {prediction['skipped']}")
        else:
            lines.append(f"prediction for {prediction['card']} ({prediction['label']}):")
            for kind, run in prediction["runs"].items():
                measured = result["runs"][kind]["output_tokens_per_s"]
                lines.append(f"  {kind:10s} measured {measured:g} tokens/s, predicted "
                             f"{run['output_tokens_per_s']:g} (upper bound)")
    return lines


def main(args: argparse.Namespace) -> int:
    """Run the chosen mode; one JSON line on stdout, a short summary on stderr."""
    try:
        setup = Setup(args)
        if args.request_rate is not None and args.request_rate <= 0:
            raise ValueError(f"--request-rate must be positive, got {args.request_rate}")
    except (ValueError, FileNotFoundError) as error:     # no CUDA, a model that does not fit, a bad config
        print(f"bench: {error}", file=sys.stderr)
        return 2
    result = prefix(setup, args) if args.prefix else capacity(setup, args)
    print(json.dumps(result), file=sys.stdout, flush=True)
    print("\n".join(summary_lines(result)), file=sys.stderr, flush=True)
    return 0
