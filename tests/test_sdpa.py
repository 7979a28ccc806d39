"""The engine's fast attention (fused SDPA) equals the plain reference, and a step runs without padding."""
import itertools

import pytest
import torch

from engine.attention import paged_attention, reference, sdpa
from engine.attention.paged_reference import paged_attention_reference
from engine.serve.engine import row_groups
from engine.serve.scheduler import Chunk


def random_case(generator, batch, tokens, q_heads, kv_heads, length=12, dim=16, ragged=True, padding=False):
    q = torch.randn(batch, q_heads, tokens, dim, generator=generator)
    keys = torch.randn(batch, kv_heads, length, dim, generator=generator)
    values = torch.randn(batch, kv_heads, length, dim, generator=generator)
    kv_lens = torch.randint(tokens, length + 1, (batch,), generator=generator) if ragged \
        else torch.full((batch,), length)
    positions = torch.stack([torch.arange(int(n) - tokens, int(n)) for n in kv_lens])
    if padding and batch > 1:
        positions[1, -1] = -1
    return q, keys, values, positions, kv_lens


@pytest.mark.parametrize("batch, tokens, q_heads, kv_heads", list(itertools.product([1, 3], [1, 5], [4, 8], [1, 2, 4])))
@pytest.mark.parametrize("ragged, padding", [(False, False), (True, False), (True, True)])
def test_fused_attention_equals_the_reference(batch, tokens, q_heads, kv_heads, ragged, padding):
    generator = torch.Generator().manual_seed(batch * 100 + tokens * 10 + q_heads + kv_heads)
    q, keys, values, positions, kv_lens = random_case(generator, batch, tokens, q_heads, kv_heads, ragged=ragged,
                                                      padding=padding)
    got, want = sdpa.attention(q, keys, values, positions, kv_lens), reference.attention(q, keys, values,
                                                                                         positions, kv_lens)
    real = (positions >= 0)[:, None, :, None]           # padding queries' outputs are meaningless
    assert ((got - want).abs() * real).max() < 1e-5


def test_a_whole_prompt_uses_the_causal_flag_and_matches():
    generator = torch.Generator().manual_seed(7)
    q, keys, values = (torch.randn(1, h, 9, 16, generator=generator) for h in (4, 2, 2))
    positions, kv_lens = torch.arange(9)[None], torch.tensor([9])
    assert (sdpa.attention(q, keys, values, positions, kv_lens)
            - reference.attention(q, keys, values, positions, kv_lens)).abs().max() < 1e-5


@pytest.mark.parametrize("tokens, lengths", [(1, [1, 4, 5, 9]), (1, [3]), (3, [7]), (2, [3, 8])])
def test_paged_sdpa_reads_through_scrambled_tables(tokens, lengths):
    generator = torch.Generator().manual_seed(len(lengths) + tokens)
    block_size, blocks, heads, dim = 4, 16, 2, 8
    k_pool, v_pool = (torch.randn(blocks, heads, block_size, dim, generator=generator) for _ in range(2))
    order = torch.randperm(blocks, generator=generator).tolist()
    width = max(-(-n // block_size) for n in lengths)
    tables = torch.tensor([[order.pop() for _ in range(width)] for _ in lengths])
    kv_lens = torch.tensor(lengths)
    positions = torch.stack([torch.arange(n - tokens, n) for n in lengths])
    q = torch.randn(len(lengths), 4, tokens, dim, generator=generator)
    got = paged_attention(q, k_pool, v_pool, tables, positions, kv_lens)        # auto on a CPU: sdpa
    want = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    assert (got - want).abs().max() < 1e-5


def test_a_step_groups_decodes_together_and_prompt_chunks_by_length():
    def chunk(count):
        return Chunk(seq=None, start=0, count=count)
    chunks = [chunk(1), chunk(104), chunk(1), chunk(7), chunk(1), chunk(100), chunk(9)]
    # decodes alone; 7 and 9 pad 2 positions, 100 and 104 pad 4: two prompt forwards, not four
    assert row_groups(chunks) == [[0, 2, 4], [3, 6], [5, 1]]
    assert row_groups(chunks, forward_cost=0) == [[0, 2, 4], [3], [6], [5], [1]]
    # 7 with 40 would pad 33 positions, more than the forward it saves
    assert row_groups([chunk(40), chunk(7)], forward_cost=32) == [[1], [0]]
    assert row_groups([chunk(40), chunk(7)], forward_cost=33) == [[1, 0]]
    assert row_groups([chunk(5)]) == [[0]] and row_groups([chunk(1), chunk(1)]) == [[0, 1]]


def test_reused_plans_and_scratch_never_leak_between_calls():
    """Layers of one forward share a read plan and scratch memory; other calls must not see them."""
    generator = torch.Generator().manual_seed(3)
    block_size, heads, dim = 4, 2, 8
    tables = torch.tensor([[5, 2, 7], [1, 3, 0]])
    for dtype, inference in [(torch.float32, True), (torch.float32, False), (torch.float16, True),
                             (torch.float32, True)]:
        k_pool, v_pool = (torch.randn(8, heads, block_size, dim, generator=generator).to(dtype) for _ in range(2))
        for lengths in ([9, 5], [12, 2], [3, 3]):   # the same table tensor, new lengths each time
            kv_lens = torch.tensor(lengths)
            positions = (kv_lens - 1)[:, None]
            q = torch.randn(2, 4, 1, dim, generator=generator).to(dtype)
            with torch.inference_mode(inference):
                got = paged_attention(q, k_pool, v_pool, tables, positions, kv_lens)
                again = paged_attention(q, k_pool, v_pool, tables, positions, kv_lens)   # the plan reused
            want = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
            tolerance = 1e-5 if dtype == torch.float32 else 2e-3
            assert (got.float() - want.float()).abs().max() < tolerance, (dtype, inference, lengths)
            assert torch.equal(got, again)


def test_length_groups_cut_sorted_rows_where_padding_costs_more_than_a_group():
    assert sdpa.length_groups([5, 7, 6]) == [[0, 2, 1]]                    # little padding: one group
    lengths = [900, 10, 880, 12, 11, 890]
    assert sdpa.length_groups(lengths) == [[1, 4, 3], [2, 5, 0]]
    assert sdpa.length_groups(lengths, group_cost=10**6) == [[1, 4, 3, 2, 5, 0]]
    assert sorted(sum(sdpa.length_groups(list(range(50, 0, -1)), group_cost=1), [])) == list(range(50))


def test_a_decode_batch_of_very_different_lengths_runs_in_groups_and_matches_the_reference():
    generator = torch.Generator().manual_seed(11)
    block_size, heads, dim, lengths = 4, 2, 8, [700, 3, 650, 9, 1, 690]
    width = max(-(-n // block_size) for n in lengths)
    order = torch.randperm(width * len(lengths), generator=generator)
    k_pool, v_pool = (torch.randn(len(order), heads, block_size, dim, generator=generator) for _ in range(2))
    tables = order.view(len(lengths), width)
    kv_lens = torch.tensor(lengths)
    positions = (kv_lens - 1)[:, None]
    q = torch.randn(len(lengths), 4, 1, dim, generator=generator)
    got = sdpa.paged_sdpa(q, k_pool, v_pool, tables, positions, kv_lens)
    assert len(sdpa._paged_plans(tables, positions, kv_lens, block_size, heads)) == 2    # short rows, long rows
    want = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    assert (got - want).abs().max() < 1e-5
