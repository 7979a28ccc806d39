"""The GPU path's host-side savings give what the CPU path gives: ModelRunner.inputs equals `pack` (on CUDA
its tensors travel in one asynchronous copy from pinned memory), and q and k rotated as one tensor equal
q and k rotated apart."""
import pytest
import torch

from engine.generate import pack
from engine.serve.engine import ModelRunner

ROWS, STARTS = [[5, 6, 7], [8], [9, 10]], [0, 40, 3]


def expected(device):
    token_ids, positions = pack(ROWS, STARTS, device)
    return token_ids, positions, torch.tensor([2, 0, 1], device=device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_inputs_equal_pack(device):
    got = ModelRunner.inputs(ROWS, STARTS, torch.device(device))
    for tensor, want in zip(got, expected(device)):
        assert tensor.device.type == device and tensor.dtype == torch.long and torch.equal(tensor, want)


def test_joint_rotation_of_q_and_k_gives_the_same_numbers():
    """The GPU path rotates q and k as one tensor; bit for bit what the CPU path's two calls give."""
    from engine.model import rope_angles, rotate_qk
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 4, 5, 16, generator=gen), torch.randn(3, 2, 5, 16, generator=gen)
    cos, sin = rope_angles(torch.arange(5).expand(3, 5) + torch.tensor([[0], [7], [40]]), 16, 1e6)
    for joint, separate in zip(rotate_qk(q, k, cos, sin, joint=True), rotate_qk(q, k, cos, sin, joint=False)):
        assert torch.equal(joint, separate)
