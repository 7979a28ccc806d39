"""Chapter 7's figures and benchmark runs: the same workload under one KV budget, four ways to reserve.

`measured` serves a small workload on the CPU with the tiny model (real forwards, real caches);
`simulated` serves the bench's workload for a published config on a GPU's roofline clock (the real
scheduler and caches, modelled step times). Both use the bench's public pieces (engine/serve).
`plot_fill_and_batch` draws KV pool fill and running sequences over engine time, one line per run.
"""
from __future__ import annotations

import textwrap

import torch

from engine.cache.paged import PagedKVCache
from engine.checkpoint import tiny_model
from engine.sampling import SamplingParams
from engine.tools import simulate
from engine.tools.bench import make_workload
from engine.tools.contiguous import ContiguousKVCache
from engine.serve.engine import Engine
from engine.serve.scheduler import SchedulerConfig

KINDS = ("max", "pow2", "oracle", "paged")
FIGURES = ("concurrent_mean_saturated", "concurrent_peak", "kv_utilization_mean", "output_tokens_per_s",
           "preemptions_recompute", "preemptions_swap", "elapsed_s")


def _serve(engine: Engine, workload) -> dict:
    """Every request at time 0, greedy, fixed output lengths; the run's summary."""
    for index, (prompt, outputs) in enumerate(workload):
        engine.add_request(prompt, SamplingParams(max_tokens=outputs, ignore_eos=True), seed=index)
    engine.run(progress=False)
    return engine.metrics.summary(engine)


def _workload(requests: int, seed: int, prompt_len: tuple[int, int], output_len: tuple[int, int]):
    return make_workload(requests, seed, prompt_len, output_len)


def measured(requests: int = 32, slots: int = 4, max_len: int = 96, block_size: int = 8,
             prompt_len=(8, 48), output_len=(4, 40), seed: int = 0) -> tuple[dict, dict]:
    """Serve one CPU workload four times under a budget of `slots` Max slots of `max_len` tokens.

    Returns ({kind: summary figures}, {kind: Metrics}): a real run of the tiny model cut to one layer.
    """
    model = tiny_model(num_layers=1, num_heads=2, num_kv_heads=1)
    workload = _workload(requests, seed, prompt_len, output_len)
    tokens = slots * max_len
    runs, metrics = {}, {}
    for kind in KINDS:
        if kind == "paged":
            cache = PagedKVCache(model.config, tokens // block_size, block_size)
        else:
            cache = ContiguousKVCache(model.config, tokens, kind, max_len)
        engine = Engine(model, cache, SchedulerConfig(max_num_seqs=4096, max_batched_tokens=128))
        summary = _serve(engine, workload)
        runs[kind] = {key: summary[key] for key in FIGURES}
        metrics[kind] = engine.metrics
    return runs, metrics


def simulated(config: str = "llama-2-13b", gpu: str = "A100-40GB", requests: int = 96, seed: int = 0,
              kinds=("max", "paged"), max_len: int = 1024) -> tuple[dict, dict, dict]:
    """The bench's uniform workload (prompts 20-500, outputs 10-200) on a roofline clock.

    Returns ({kind: figures + time split}, {kind: Metrics}, the roofline's constants). A SIMULATION.
    """
    roofline = simulate.Roofline(simulate.load_config(config), simulate.GPUS[gpu], name=config)
    tokens = roofline.kv_budget_bytes() // roofline.kv_bytes_per_token
    workload = _workload(requests, seed, (20, 500), (10, 200))
    runs, metrics = {}, {}
    for kind in kinds:
        if kind == "paged":
            cache = simulate.BookkeepingPagedCache(tokens // 16, 16)
        else:
            cache = ContiguousKVCache(roofline.config, tokens, kind, max_len, store=False)
        runner = simulate.SimulatedRunner(roofline, cache)
        engine = Engine(None, cache, SchedulerConfig(max_num_seqs=4096, max_batched_tokens=8192),
                        runner=runner)
        summary = _serve(engine, workload)
        runs[kind] = {key: summary[key] for key in FIGURES} | runner.time_split()
        metrics[kind] = engine.metrics
    return runs, metrics, roofline.constants() | {"kv_tokens": tokens}


def decode_rates(config: str = "llama-2-13b", gpu: str = "A100-40GB", context: int = 500,
                 batches=(1, 2, 4, 8, 16, 32, 64, 128, 256)) -> list[dict]:
    """Decode steps of `batch` sequences, each `context` tokens long, on the roofline: step time,
    tokens/s, the roof it hits, and the share of the bytes read that is KV rather than weights."""
    roofline = simulate.Roofline(simulate.load_config(config), simulate.GPUS[gpu], name=config)
    rows = []
    for batch in batches:
        seconds, bound = roofline.step_seconds([(context, 1, True)] * batch, with_bound=True)
        kv = batch * (context + 1) * roofline.kv_bytes_per_token
        rows.append({"batch": batch, "step_ms": round(seconds * 1e3, 2), "tokens_per_s": round(batch / seconds),
                     "bound": bound, "kv_share": round(kv / (kv + roofline.weight_bytes), 3),
                     "fits": kv <= roofline.kv_budget_bytes()})
    return rows


def plot_decode_rates(rows: list[dict], title: str = ""):
    """Tokens/s against batch size (log-log), the batches that fit the KV budget drawn solid."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.6))
    batches = [r["batch"] for r in rows]
    ax.plot(batches, [r["tokens_per_s"] for r in rows], color="lightgray", ls="--", zorder=1)
    fits = [r for r in rows if r["fits"]]
    ax.plot([r["batch"] for r in fits], [r["tokens_per_s"] for r in fits], "o-", color="tab:blue",
            label="fits in the KV budget", zorder=2)
    ax.plot(batches, [r["batch"] * rows[0]["tokens_per_s"] for r in rows], ":", color="tab:green",
            label="perfect scaling (batch x one sequence)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequences decoding together")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=11)
    if title:
        ax.set_title("\n".join(textwrap.wrap(title, 48)), fontsize=11)
    fig.tight_layout()
    plt.show()


def plot_fill_and_batch(metrics: dict, title: str = "", time_unit: str = "s"):
    """KV pool fill (tokens held / pool) and running sequences over engine time, one line per run."""
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(5, 4.4))
    for label, run in metrics.items():
        times = [s.time for s in run.steps]
        top.plot(times, [s.live_tokens / s.pool_tokens for s in run.steps], label=label, lw=1.2)
        bottom.plot(times, [s.running for s in run.steps], label=label, lw=1.2)
    top.set_ylabel("KV pool fill")
    top.set_ylim(0, 1.05)
    bottom.set_ylabel("running sequences")
    bottom.set_xlabel(f"engine time ({time_unit})")
    top.legend(loc="lower right", fontsize=11)
    if title:
        top.set_title("\n".join(textwrap.wrap(title, 48)), fontsize=11)
    fig.tight_layout()
    plt.show()


def step_trace(engine: Engine, limit: int = 400) -> list[dict]:
    """Run `engine` to the end, recording after each step who runs, waits, sits swapped, and why."""
    trace = []
    before = dict(engine.scheduler.preemptions)
    while engine.has_unfinished() and len(trace) < limit:
        engine.step()
        now = dict(engine.scheduler.preemptions)
        record = engine.metrics.steps[-1]
        trace.append({"rows": record.rows, "tokens": record.tokens,
                      "running": [s.seq_id for s in engine.scheduler.running],
                      "waiting": [s.seq_id for s in engine.scheduler.waiting],
                      "swapped": [s.seq_id for s in engine.scheduler.swapped],
                      "free_blocks": engine.cache.allocator.num_free,
                      "recomputed": now["recompute"] - before["recompute"],
                      "swapped_out": now["swap"] - before["swap"]})
        before = now
    return trace


def plot_trace(trace: list[dict], num_blocks: int, title: str = ""):
    """Blocks in use and the three queues per step, preemptions marked (the chapter's walk-through)."""
    import matplotlib.pyplot as plt
    steps = range(1, len(trace) + 1)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(5, 4.0))
    top.plot(steps, [num_blocks - t["free_blocks"] for t in trace], color="tab:blue")
    top.axhline(num_blocks, color="gray", ls=":", lw=1)
    top.set_ylabel("blocks in use")
    for name, color in (("running", "tab:green"), ("waiting", "tab:orange"), ("swapped", "tab:purple")):
        bottom.plot(steps, [len(t[name]) for t in trace], label=name, color=color)
    for step, t in zip(steps, trace):
        for key, marker in (("recomputed", "x"), ("swapped_out", "v")):
            if t[key]:
                top.plot([step], [num_blocks], marker, color="tab:red", ms=7)
    bottom.set_ylabel("sequences")
    bottom.set_xlabel("engine step (red: x recompute, v swap)")
    bottom.legend(fontsize=11, ncol=3)
    if title:
        top.set_title("\n".join(textwrap.wrap(title, 48)), fontsize=11)
    fig.tight_layout()
    plt.show()


def traced(engine: Engine) -> list[dict]:
    """step_trace without autograd."""
    return no_grad(lambda: step_trace(engine))


def no_grad(fn):
    """Run `fn` without autograd (the figures only run forwards)."""
    with torch.no_grad():
        return fn()
