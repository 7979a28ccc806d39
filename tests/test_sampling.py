"""Sampling: greedy is argmax, seeds reproduce, top-k and top-p cut where they should."""
import pytest
import torch

from engine.sampling import SamplingParams, sample

LOGITS = torch.tensor([0.0, 3.0, 2.9, 1.0, -1.0])


def draws(params, n=300, seed=0):
    g = SamplingParams(seed=seed).generator()
    return [sample(LOGITS, params, g) for _ in range(n)]


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams(), torch.Generator()) == 1


def test_same_seed_same_samples_other_seed_other_samples():
    params = SamplingParams(temperature=1.0)
    assert draws(params, seed=7) == draws(params, seed=7)
    assert draws(params, seed=7) != draws(params, seed=8)


def test_top_k_keeps_only_the_k_best():
    assert set(draws(SamplingParams(temperature=5.0, top_k=2))) == {1, 2}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.softmax(LOGITS, -1)             # token 1: 0.47, token 2: 0.42, ...
    assert probs[1] < 0.5 < probs[1] + probs[2]
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.5))) == {1, 2}
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.4))) == {1}


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2)])
def test_bad_params_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)
