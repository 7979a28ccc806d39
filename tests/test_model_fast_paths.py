"""The model's cheaper forms compute the very numbers of the plain ones (torch.equal, not a tolerance)."""
import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from engine.attention.reference import visibility_mask
from engine.attention.sdpa import additive
from engine.config import ModelConfig
from engine.model import MLP, rms_normalize, rope_angles


@pytest.mark.parametrize("shape", [(1, 1, 256), (3, 17, 64), (2, 5, 12, 32), (1, 1, 10, 20)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_normalize_is_torch_rms_norm(shape, dtype):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    expected = torch.rms_norm(x.float(), (shape[-1],), eps=1e-6)
    assert torch.equal(rms_normalize(x, 1e-6), expected)


@pytest.mark.parametrize("rows", [1, 7, 100])
def test_the_stacked_gate_and_up_projection_is_the_two_products(rows):
    config = ModelConfig.from_hf(dict(vocab_size=64, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                                      head_dim=32, intermediate_size=768, num_hidden_layers=1))
    torch.manual_seed(0)
    mlp = MLP(config)
    x = torch.randn(1, rows, 256)
    with torch.no_grad():
        plain = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        assert torch.equal(mlp(x), plain)
        mlp.up_proj.weight.mul_(2)                         # a changed weight is never read stale
        assert torch.equal(mlp(x), mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)))


@pytest.mark.parametrize("head_dim", [4, 20, 32, 128])
def test_rope_angles_are_the_half_width_angles_written_twice(head_dim):
    positions = torch.tensor([[0, 1, 2, -1], [7, 300, 4095, 40000]])
    half = head_dim // 2
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, half, dtype=torch.float32) / half)
    angles = positions.clamp(min=0).float()[:, None, :, None] * inv_freq
    cos, sin = rope_angles(positions, head_dim, 1e6)
    assert torch.equal(cos, torch.cat([angles.cos(), angles.cos()], dim=-1))
    assert torch.equal(sin, torch.cat([-angles.sin(), angles.sin()], dim=-1))


def test_an_additive_mask_attends_as_the_boolean_one():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 4, 6, 16, generator=generator) for _ in range(3))
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [2, 3, 4, -1, -1, -1], [5, -1, -1, -1, -1, -1]])
    visible = visibility_mask(positions, torch.tensor([6, 5, 6]), 6)[:, None]
    mask = additive(visible)
    assert mask.dtype == torch.float32 and set(mask.unique().tolist()) == {0.0, float("-inf")}
    assert torch.equal(scaled_dot_product_attention(q, k, v, attn_mask=mask),
                       scaled_dot_product_attention(q, k, v, attn_mask=visible))
