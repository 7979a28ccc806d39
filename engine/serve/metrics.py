"""What a serving run is judged by: throughput, time to first token, KV utilization, preemptions, hits.

The engine calls `record_step` once per step; `summary` turns the records into one flat dict (the
bench prints it as JSON) and `plot` draws KV utilization and batch size over time.
Times come from the engine clock: measured seconds on a real run, modelled seconds in a simulation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import mean


def kv_footprint(cache, seq_ids) -> tuple[int, int, int]:
    """(tokens stored, token slots reserved, token slots in the whole pool) for the given sequences.

    A paged cache reserves whole blocks; a slot cache reserves a region per sequence. Blocks shared
    by several sequences are counted once per sequence, like the tokens they hold.
    """
    live = sum(cache.length(s) for s in seq_ids)
    if hasattr(cache, "allocator"):
        size = cache.block_size
        reserved = sum(len(cache.table(s)) for s in seq_ids) * size
        return live, reserved, cache.allocator.num_blocks * size
    if hasattr(cache, "reserved"):                     # variable-size contiguous regions
        return live, sum(cache.reserved(s) for s in seq_ids), cache.pool_tokens
    return live, cache.capacity * len(seq_ids), cache.capacity * cache.max_seqs   # StaticKVCache


@dataclass
class StepRecord:
    """One engine step: when it ended, how big the batch was, and what the cache held afterwards."""

    time: float
    rows: int                 # sequences in this forward
    running: int              # sequences holding KV memory after the step
    waiting: int              # sequences still queued after the step (> 0: memory is what limits)
    tokens: int               # tokens computed (prefill chunks + replays + decodes)
    prompt_tokens: int        # of which prompt positions (what prefix caching saves)
    live_tokens: int
    reserved_tokens: int
    pool_tokens: int


@dataclass
class Metrics:
    """Per-step records, summarised on demand."""

    steps: list[StepRecord] = field(default_factory=list)

    def record_step(self, engine, chunks) -> None:
        """Append the record of the step that just ran (called by Engine.step)."""
        running = [s.seq_id for s in engine.scheduler.running]
        live, reserved, pool = kv_footprint(engine.cache, running)
        prompt = sum(max(0, min(c.start + c.count, c.seq.prompt_len) - c.start) for c in chunks)
        waiting = len(engine.scheduler.waiting) + len(engine.scheduler.swapped)
        self.steps.append(StepRecord(engine.now, len(chunks), len(running), waiting,
                                     sum(c.count for c in chunks), prompt, live, reserved, pool))

    def summary(self, engine) -> dict:
        """One flat dict of the run's figures: throughput, TTFT, concurrency, KV use, preemptions, hits."""
        requests = [r for r in engine.requests.values() if r.sequences]
        seqs = [s for r in requests for s in r.sequences]
        elapsed = engine.now
        output_tokens = sum(len(s.output) for s in seqs)
        ttft = sorted(min(s.first_token_time for s in r.sequences) - r.arrival
                      for r in requests if all(s.first_token_time is not None for s in r.sequences))
        # The vLLM paper's latency figure: end-to-end latency over output length, averaged over requests.
        normalized = [(max(s.finish_time for s in r.sequences) - r.arrival)
                      / max(1, len(r.sequences[0].output))
                      for r in requests if all(s.finish_time is not None for s in r.sequences)]
        steps = self.steps or [StepRecord(0, 0, 0, 0, 0, 0, 0, 0, 1)]
        saturated = [s.running for s in steps if s.waiting] or [0]
        sched = engine.scheduler
        stats = sched.prefix_stats
        return {
            "requests": len(requests),
            "steps": len(self.steps),
            "output_tokens": output_tokens,
            "elapsed_s": round(elapsed, 4),
            "output_tokens_per_s": round(output_tokens / elapsed, 2) if elapsed > 0 else 0.0,
            "requests_per_s": round(len(requests) / elapsed, 3) if elapsed > 0 else 0.0,
            "normalized_latency_s_per_token": round(mean(normalized), 5) if normalized else None,
            "ttft_mean_s": round(mean(ttft), 5) if ttft else None,
            "ttft_p50_s": round(percentile(ttft, 50), 5) if ttft else None,
            "ttft_p99_s": round(percentile(ttft, 99), 5) if ttft else None,
            "concurrent_peak": max(s.running for s in steps),
            "concurrent_mean": round(mean(s.running for s in steps), 2),
            "concurrent_mean_saturated": round(mean(saturated), 2),     # steps with a queue
            "saturated_fraction": round(sum(1 for s in steps if s.waiting) / len(steps), 3),
            "kv_utilization_mean": round(mean(s.live_tokens / s.reserved_tokens if s.reserved_tokens else 0.0
                                              for s in steps), 4),
            "kv_pool_fill_mean": round(mean(s.live_tokens / s.pool_tokens for s in steps), 4),
            "kv_pool_fill_peak": round(max(s.live_tokens / s.pool_tokens for s in steps), 4),
            "preemptions_recompute": sched.preemptions["recompute"],
            "preemptions_swap": sched.preemptions["swap"],
            "tokens_computed": sum(s.tokens for s in self.steps),
            "prompt_tokens_computed": sum(s.prompt_tokens for s in self.steps),
            "prefix_queries": stats["queries"],
            "prefix_hit_rate": round(stats["hits"] / stats["queries"], 4) if stats["queries"] else 0.0,
            "prefix_tokens_saved": stats["tokens_saved"],
        }

    def plot(self, path, title: str = "", other: "Metrics | None" = None, labels=("paged", "static")) -> None:
        """Save a figure: KV pool fill and running sequences over time (optionally two runs overlaid)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
        for metrics, label in ((self, labels[0]), (other, labels[1])):
            if metrics is None or not metrics.steps:
                continue
            times = [s.time for s in metrics.steps]
            top.plot(times, [s.live_tokens / s.pool_tokens for s in metrics.steps], label=label)
            bottom.plot(times, [s.running for s in metrics.steps], label=label)
        top.set_ylabel("KV pool holding tokens")        # above 1 when blocks are shared
        top.set_ylim(0, None)
        bottom.set_ylabel("running sequences")
        bottom.set_xlabel("engine time (s)")
        top.legend()
        top.set_title(title)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile of an already sorted list, by the nearest-rank method."""
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]
