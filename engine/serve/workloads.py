"""Benchmark workloads: seeded request lengths (uniform, or the vLLM paper's dataset mixes) and arrivals."""
from __future__ import annotations

import math
import random

# The vLLM paper's (Kwon et al., SOSP 2023, section 6.1) datasets: mean prompt and output tokens.
MIXES = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}
MIX_SIGMA = 0.8              # lognormal spread of the synthetic mixes: long-tailed, as in the paper's fig. 11


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
