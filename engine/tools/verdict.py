"""What a benchmark run means: paged over the other policies, the paper's 2-4x band, and the summary lines."""
from __future__ import annotations

from engine.tools.bench_setup import KINDS, Setup

PAPER_BAND = (2.0, 4.0)      # paged/Orca throughput the paper reports (2-4x; up to 22x over HF/FT is others)


def ratio(a, b):
    """a / b rounded, or None when b is zero (or either is missing)."""
    return round(a / b, 3) if a is not None and b else None


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
        if setup.device == "cpu" and throughput is not None:
            gained = throughput >= 1
            reasons.insert(0, f"paging holds {concurrency}x as many sequences, so steps are fewer and fuller "
                              f"(paged {paged['steps']} steps against Max's {static['steps']}); on a CPU a "
                              "step's fixed cost (Python, one forward for its decodes and one per group of "
                              "similar prompt chunks) "
                              + ("is shared by more rows, so concurrency becomes tokens/s" if gained else
                                 "did not shrink enough per row to pay for the longer histories it reads"))
        verdict["why"] = (f"{throughput}x is {where} the band, but the band is a GPU figure: this run is "
                          f"measured on {setup.device.upper()}" + "".join(f"; {r}" for r in reasons))
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
