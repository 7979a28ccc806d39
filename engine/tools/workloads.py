"""Benchmark workloads: seeded request lengths (uniform, or the vLLM paper's dataset mixes) and arrivals."""
from __future__ import annotations

import math
import random

from engine.errors import InputError

# The vLLM paper's (Kwon et al., SOSP 2023, section 6.1) datasets: mean prompt and output tokens.
MIXES = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}
MIX_SIGMA = 0.8              # lognormal spread of the synthetic mixes: long-tailed, as in the paper's fig. 11
MAX_REDRAWS = 100_000        # a pair redrawn this often in a row means the mix cannot fit max_len
PREFIX_OWN_MIN, PREFIX_OWN_MAX, PREFIX_OUTPUT = 16, 64, 16     # the prefix workload's own tokens and outputs


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
    check_mix(mix, max_len, scale)
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


def check_mix(mix: str, max_len: int, scale: float, what: str | None = None) -> None:
    """Refuse a mix whose pairs could not keep their means under max_len (or not be drawn at all);
    `what` says where max_len came from, for the message.

    Below the mean prompt + output, most draws are too long: the redraws take ever longer and the
    calibration cannot keep the means; under 2 tokens no pair (a prompt and an output) fits at all.
    """
    if mix not in MIXES:
        raise InputError(f"unknown mix {mix!r}; known: {', '.join(MIXES)}")
    if not (math.isfinite(scale) and scale > 0):
        raise InputError(f"the {mix} mix's scale must be a finite number > 0, got {scale}")
    mean = sum(MIXES[mix]) * scale
    if max_len < max(2, mean):
        raise InputError(f"{what or f'max_len {max_len}'} is too short for the {mix} mix, whose prompt + output "
                         f"averages {mean:.3g} tokens (x scale {scale:g}): it must be at least "
                         f"{max(2, math.ceil(mean))}")


def mix_lengths(rng: random.Random, mus: list[float], max_len: int) -> tuple[int, int]:
    """One (prompt, output) pair of lognormal lengths that fits in max_len (redrawn until it does)."""
    for _ in range(MAX_REDRAWS):
        prompt, output = (max(1, round(rng.lognormvariate(mu, MIX_SIGMA))) for mu in mus)
        if prompt + output <= max_len:
            return prompt, output
    raise InputError(f"no pair of lengths under max_len {max_len} in {MAX_REDRAWS} draws: raise max_len")


def arrival_times(requests: int, rate: float | None, seed: int) -> list[float] | None:
    """Poisson arrivals (exponential gaps, mean 1/rate seconds), or None: every request at time 0."""
    if rate is None:
        return None
    if not (math.isfinite(rate) and rate > 0):
        raise InputError(f"--request-rate must be a finite number > 0 (requests per second), got {rate}")
    rng, now, times = random.Random(seed + 1), 0.0, []
    for _ in range(requests):
        now += rng.expovariate(rate)
        times.append(now)
    return times


def make_prefix_workload(requests: int, seed: int, system_len: int, vocab: int = 256):
    """Requests that share one system prompt, each followed by 16-64 tokens of its own; 16 outputs."""
    if system_len < 1:
        raise InputError(f"a prefix workload needs a shared system prompt of at least 1 token, got {system_len}")
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_len)]
    own = [[rng.randrange(vocab) for _ in range(rng.randint(PREFIX_OWN_MIN, PREFIX_OWN_MAX))]
           for _ in range(requests)]
    return [(system + tokens, PREFIX_OUTPUT) for tokens in own]
