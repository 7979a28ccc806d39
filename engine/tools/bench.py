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
import sys

import torch

from engine.errors import InputError
from engine.sampling import SamplingParams
from engine.tools.bench_setup import KINDS, Setup
from engine.serve.engine import Engine
from engine.tools.verdict import paged_ratios, paper_band, ratio, summary_lines
from engine.tools.workloads import MIX_SIGMA, MIXES, arrival_times, make_mix_workload, make_prefix_workload, \
    make_workload

REPORTED = ("concurrent_peak", "concurrent_mean", "concurrent_mean_saturated", "saturated_fraction",
            "kv_utilization_mean", "kv_pool_fill_mean", "preemptions_recompute", "preemptions_swap",
            "output_tokens_per_s", "requests_per_s", "normalized_latency_s_per_token", "ttft_mean_s",
            "elapsed_s", "steps", "output_tokens", "prompt_tokens_computed", "prefix_hit_rate",
            "prefix_tokens_saved")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options; every default is the documented workload (CPU defaults in brackets).

    Each value is checked by its type as it is parsed, the options together by `check_args`, and what
    they imply for the model and the budget by Setup.check, all before anything runs.
    """
    from engine.tools import cli_args as check
    from engine.tools.simulate import GPUS
    parser.epilog = ("Limits: lengths, --slots, --block-size, --token-budget and --system-len are whole numbers "
                     ">= 1, MIN <= MAX; --scale and --request-rate finite numbers > 0. The longest request must "
                     "fit the model's context and every policy's share of the KV budget, and a real run must "
                     "fit in half the memory. A bad input prints one 'error: ...' line and exits with status 2.")
    parser.add_argument("--requests", type=check.int_in(1, MAX_REQUESTS), default=None,
                        help=f"requests, 1 to {MAX_REQUESTS:,} [256 (--prefix: 64); simulated: 256, or twice "
                             "what the paged pool holds if more, which takes minutes for an 80 GB GPU]")
    parser.add_argument("--workload", choices=("uniform",) + tuple(MIXES), default="uniform",
                        help="uniform: --prompt-len/--output-len; sharegpt/alpaca: synthetic lognormal "
                             "lengths with the vLLM paper's means (ShareGPT 161 in/338 out, output-heavy; "
                             "Alpaca 19 in/58 out), pairs longer than --max-len redrawn (--max-len must be at "
                             "least the mean pair)")
    parser.add_argument("--request-rate", type=check.positive_float, default=None, metavar="REQ_PER_S",
                        help="Poisson arrivals at this rate (> 0) on the engine clock [all requests at time 0]")
    parser.add_argument("--prompt-len", type=check.positive_int, nargs=2, default=PROMPT_LEN, metavar=("MIN", "MAX"),
                        action=check.Ordered, help="prompt tokens, uniform (before --scale); 1 <= MIN <= MAX")
    parser.add_argument("--output-len", type=check.positive_int, nargs=2, default=OUTPUT_LEN, metavar=("MIN", "MAX"),
                        action=check.Ordered, help="output tokens, uniform (before --scale); EOS is ignored; "
                                                   "1 <= MIN <= MAX")
    parser.add_argument("--scale", type=check.positive_float, default=None,
                        help="multiply the capacity workload's lengths and --max-len (> 0; a length is at least 1) "
                             "[0.5 on CPU, 1 simulated or on CUDA]; the --prefix workload is not scaled")
    parser.add_argument("--seed", type=check.seed, default=0, help="the workload's seed (0 to 2**63 - 1)")
    parser.add_argument("--max-len", type=check.positive_int, default=1024,
                        help="the Max policy's slot length (>= 1; at least the longest request)")
    parser.add_argument("--block-size", type=check.positive_int, default=16,
                        help="tokens per paged block (>= 1; the paged pool must hold the longest request)")
    parser.add_argument("--slots", type=check.positive_int, default=SLOTS,
                        help="real-run KV budget in Max slots (>= 1): bytes = slots * max-len * KV bytes per token")
    parser.add_argument("--token-budget", type=check.positive_int, default=None,
                        help="tokens per step (>= 1) [256 on CPU; 8192 simulated or on CUDA]")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), action=check.Distinct,
                        help="which reservation policies to run (each once)")
    parser.add_argument("--prefix", action="store_true",
                        help="shared-system-prompt workload, prefix caching on vs off (all requests at time 0)")
    parser.add_argument("--system-len", type=check.positive_int, default=SYSTEM_LEN,
                        help="--prefix: shared prompt tokens (>= 1)")
    parser.add_argument("--simulate", metavar="CONFIG", type=check.non_empty,
                        help="a config.json path or name in engine/configs")
    parser.add_argument("--gpu", default=None, choices=list(GPUS),
                        help="GPU of the roofline, with --simulate or --device cuda [--simulate: H100-80GB; "
                             "--device cuda: the detected card]")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the real (not simulated) run executes")
    parser.add_argument("--model-config", metavar="CONFIG", default=None, type=check.non_empty,
                        help="real run: a model of this config's shape with random weights (e.g. qwen3-0.6b) "
                             "[the tiny model cut to 1 layer and 2 heads]")
    parser.add_argument("--plot", metavar="PATH", type=check.output_file(*check.FIGURE_SUFFIXES),
                        help="save KV fill and batch size over time (its folder must exist; .png, .pdf, .svg, ...)")
    parser.add_argument("--quiet", action="store_true", help="no tqdm bars on stderr")


MAX_REQUESTS = 100_000      # a million requests' prompts alone would fill gigabytes before the first step
# Defaults that check_args compares with, to refuse an option the chosen mode would ignore.
PROMPT_LEN, OUTPUT_LEN, SLOTS, SYSTEM_LEN = (20, 500), (10, 200), 12, 256


def check_args(args) -> None:
    """Refuse options that contradict each other (each value was checked as it was parsed).

    An option the chosen mode ignores would be silently dropped, so it is refused instead.
    """
    def refuse(message):
        raise InputError(message)
    if args.prefix and args.request_rate is not None:
        refuse(f"--request-rate {args.request_rate:g} does not apply to --prefix, which adds every request at "
               "time 0: drop one of them")
    if args.prefix and args.workload != "uniform":
        refuse(f"--workload {args.workload} does not apply to --prefix, which serves its own shared-prompt "
               "workload: drop one of them")
    lengths = [f"--{name.replace('_', '-')} {' '.join(map(str, getattr(args, name)))}"
               for name, default in (("prompt_len", PROMPT_LEN), ("output_len", OUTPUT_LEN))
               if tuple(getattr(args, name)) != default]
    if args.prefix and lengths:
        refuse(f"{lengths[0]} does not apply to --prefix, which serves its own shared-prompt workload "
               "(--system-len, 16-64 own tokens, 16 outputs): drop one of them")
    if args.prefix and list(args.kinds) != list(KINDS):
        refuse(f"--kinds {' '.join(args.kinds)} does not apply to --prefix, which runs the paged cache only "
               "(prefix caching on and off): drop one of them")
    if not args.prefix and args.system_len != SYSTEM_LEN:
        refuse(f"--system-len {args.system_len} applies to --prefix only: add --prefix or drop it")
    if args.workload != "uniform" and lengths:
        refuse(f"{lengths[0]} does not apply to --workload {args.workload}, which draws its own lengths "
               "(fitted to the vLLM paper's means): drop one of them")
    if args.simulate and args.slots != SLOTS:
        refuse(f"--slots {args.slots} does not apply to --simulate, whose KV budget is what the GPU's memory "
               "holds after the weights: drop one of them")
    if args.simulate and args.device != "cpu":
        refuse(f"--simulate models a GPU with a roofline clock; --device {args.device} is for a real run: drop one")
    if args.simulate and args.model_config:
        refuse(f"--simulate {args.simulate} already names the model; --model-config {args.model_config} is for a "
               "real run: drop one")
    if args.gpu and not args.simulate and args.device != "cuda":
        refuse(f"--gpu {args.gpu} names the card of a simulation (--simulate) or of a real run's prediction "
               "(--device cuda); a CPU run has none: drop it")


def serve(engine: Engine, workload, progress: bool | None, desc: str = "requests",
          arrivals: list[float] | None = None) -> dict:
    """Serve the workload (greedy, fixed lengths) to the end, summarise.

    Without `arrivals` every request is added at time 0; with them, request i joins the queue once the
    engine clock reaches arrivals[i] (an idle engine skips ahead to the next arrival).
    """
    for index, (prompt, outputs) in enumerate(workload):
        engine.add_request(prompt, SamplingParams(max_tokens=outputs, ignore_eos=True), seed=index,
                           arrival=None if arrivals is None else arrivals[index])
    engine.run(progress=progress, desc=desc)
    summary = engine.metrics.summary(engine)
    report = {key: summary[key] for key in REPORTED}
    if hasattr(engine.runner, "time_split"):
        report.update(engine.runner.time_split())
    return report


def capacity_workload(setup: Setup, args):
    """The capacity mode's requests, arrival times, and a description of both for the JSON."""
    if args.workload == "uniform":
        prompt_mean, output_mean = sum(setup.prompt_len) / 2, sum(setup.output_len) / 2
    else:
        prompt_mean, output_mean = (m * setup.scale for m in MIXES[args.workload])
    requests = setup.requests()
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


def predict(setup: Setup, args, workload, arrivals) -> dict:
    """The simulation's prediction for this card: same config, workload and KV bytes, roofline clock."""
    from engine.tools.simulate import gpu_for_device_name
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
    requests = setup.requests()
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


def main(args: argparse.Namespace) -> int:
    """Run the chosen mode; one JSON line on stdout, a short summary on stderr.

    Bad options raise InputError before anything runs (`python -m engine` prints it in one line).
    """
    check_args(args)
    setup = Setup(args)                   # checks what the options imply, then builds the model
    result = prefix(setup, args) if args.prefix else capacity(setup, args)
    print(json.dumps(result), file=sys.stdout, flush=True)
    print("\n".join(summary_lines(result)), file=sys.stderr, flush=True)
    return 0
