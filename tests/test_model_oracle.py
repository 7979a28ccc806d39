"""The engine's Qwen3 against transformers' own Qwen3ForCausalLM on the same tiny checkpoint."""
import pytest
import torch

from engine.checkpoint import TRAINED_DIR, load_model, write_tiny_checkpoint
from engine.generate import scratch_logits

transformers = pytest.importorskip("transformers")

CASES = [  # (tied head, query heads, KV heads): GQA groups of 1, 2 and 4
    (False, 4, 4), (True, 4, 2), (False, 4, 1), (True, 8, 2),
]


def hf_logits(path, ids):
    model = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("tied, heads, kv_heads", CASES)
def test_logits_match_transformers(tmp_path, tied, heads, kv_heads):
    path = write_tiny_checkpoint(tmp_path, seed=3, tie_word_embeddings=tied, num_heads=heads,
                                 num_kv_heads=kv_heads)
    ours = load_model(path)
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (13, 1, 7)]
    # one ragged batch through the engine; each sequence alone through transformers
    for ids, got in zip(sequences, scratch_logits(ours, sequences)):
        expected = hf_logits(path, ids)
        diff = (got - expected).abs().max().item()
        assert diff <= 1e-5, f"length {len(ids)}: max |engine - transformers| = {diff:.2e}"


def test_a_wrong_weight_is_noticed(tmp_path):
    """The oracle can fail: perturb one norm weight and the logits drift past the tolerance."""
    path = write_tiny_checkpoint(tmp_path, seed=3)
    ours = load_model(path)
    with torch.no_grad():
        ours.layers[1].self_attn.k_norm.weight[0] += 0.5
    ids = list(range(40, 60))
    assert (scratch_logits(ours, [ids])[0] - hf_logits(path, ids)).abs().max() > 1e-3


@pytest.mark.parametrize("weight", ["q_proj", "v_proj", "k_norm"])
def test_a_weight_changed_after_a_forward_is_read_fresh(tmp_path, weight):
    """The stacked q/k/v projection and q/k norm weights are made at the first forward; a weight written
    in place afterwards is read fresh (the stack is remade), as transformers reads it."""
    path = write_tiny_checkpoint(tmp_path, seed=3)
    ours = load_model(path)
    ids = list(range(40, 60))
    before = scratch_logits(ours, [ids])[0]
    with torch.no_grad():
        getattr(ours.layers[1].self_attn, weight).weight[0] += 0.5
    theirs = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        getattr(theirs.model.layers[1].self_attn, weight).weight[0] += 0.5
        expected = theirs.eval()(torch.tensor([ids])).logits[0]
    got = scratch_logits(ours, [ids])[0]
    assert (got - before).abs().max() > 1e-3
    assert (got - expected).abs().max() <= 1e-5


def test_the_trained_model_matches_transformers():
    """The committed trained checkpoint (bfloat16 on disk, float32 here) too, on the course's words."""
    ids = list(b"The block table maps each sequence's logical blocks to physical ones.")
    got = scratch_logits(load_model(TRAINED_DIR), [ids])[0]
    expected = hf_logits(TRAINED_DIR, ids)
    diff = (got - expected).abs().max().item()
    assert expected.abs().max() > 5          # trained logits, far from a random model's near-ties
    assert diff <= 2e-5 * expected.abs().max().item(), f"max |engine - transformers| = {diff:.2e}"
