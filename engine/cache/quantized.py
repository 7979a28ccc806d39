"""QuantizedPagedKVCache: the paged cache with int8 blocks, one scale per block per KV head.

A block is already the unit of allocation, copy and transfer, so it is also the quantization group:
each layer keeps, beside its int8 pools `[num_blocks, kv_heads, block_size, head_dim]`, a float32
scale per block and KV head (`[num_blocks, kv_heads]`, K and V apart). Stored value `x` is the code
`q = round(x / s)` in [-127, 127]; reading gives back `q * s`. Because the scale is indexed by the
physical block, it travels with the block: a fork or a prefix-cache hit shares it with the codes,
copy-on-write copies it, swap carries it.

When the scale is set. Tokens arrive one step at a time, so a block's later tokens may be larger
than the ones that set its scale. Clamping them to the old range would clip outliers by any amount;
instead the scale grows to cover the new tokens and the codes already stored are re-rounded to it
(`round(q * s_old / s_new)`, at most half a new step of extra error per growth). That rewrites the
block, which is only allowed while the writer is its sole owner: `reserve` copies a shared block
before anything is written into it (chapter 4), and `store` refuses to touch a block with more than
one owner, so a block another sequence reads (a fork's sibling, the prefix cache) never changes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.reference import attention as reference_attention
from engine.cache.kv_pool import KVPool
from engine.cache.paged import PagedKVCache, SwappedSequence
from engine.cache.protocol import kv_lengths
from engine.cache.slots import blocks_needed, slot_mapping
from engine.errors import InputError

QMAX = 127                    # symmetric int8: codes in [-127, 127], so -x is always representable
SCALE_FLOOR = 1e-12           # the scale of an all-zero block: any positive number reads back 0
SCALE_BYTES = 4               # one float32 scale per block, KV head, layer, and K or V


def kv_bytes_per_token(config, kv_dtype: str = "int8", block_size: int = 16) -> float:
    """KV bytes one token costs: codes plus its share of the per-block scales (float for int8)."""
    elements = 2 * config.num_layers * config.num_kv_heads * config.head_dim
    if kv_dtype in ("fp16", "bf16"):
        return elements * 2
    if kv_dtype != "int8":
        raise ValueError(f"kv_dtype must be 'int8', 'fp16' or 'bf16', got {kv_dtype!r}")
    scales = 2 * config.num_layers * config.num_kv_heads * SCALE_BYTES
    return elements + scales / block_size


@dataclass
class QuantizedSwap(SwappedSequence):
    """A swapped-out sequence's int8 codes and the scales of its blocks, [layers, blocks, kv_heads]."""

    k_scales: torch.Tensor = None
    v_scales: torch.Tensor = None


class QuantizedPagedKVCache(PagedKVCache):
    """A PagedKVCache whose pools hold int8 codes and whose blocks carry their own scales."""

    def __init__(self, config, num_blocks: int, block_size: int = 16, dtype=torch.float32,
                 device="cpu", allocator=None, attention: str = "auto"):
        """int8 pools plus scales; `dtype` is what reads return. Attention always reads dequantized
        blocks (the Triton kernels of chapter 6 read fp pools), so attention is 'auto' or 'reference'."""
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InputError(f"QuantizedPagedKVCache: dtype is what reads return (codes times scales), so it "
                             f"must be a floating dtype such as torch.float32, got {dtype!r}")
        if attention not in ("auto", "reference"):
            raise ValueError(f"an int8 cache attends over dequantized blocks: attention must be 'auto' "
                             f"or 'reference', got {attention!r}")
        super().__init__(config, num_blocks, block_size, dtype=torch.int8, device=device,
                         allocator=allocator, attention="reference")
        self.read_dtype = dtype
        self.scales = KVPool(config.num_layers, (num_blocks, config.num_kv_heads), torch.float32, device)
        self.k_scales, self.v_scales = self.scales.keys, self.scales.values

    # ---- quantize on write, dequantize on read (chapter 8's exercise) ----

    def quantize_into(self, pool: torch.Tensor, scales: torch.Tensor,
                      blocks: torch.Tensor, offsets: torch.Tensor,
                      rows: torch.Tensor) -> None:
        """Write rows [N, Hkv, D] as int8 codes at (blocks[i], :, offsets[i]) of pool.

        scales [num_blocks, Hkv] keeps each block's largest |value| per head / 127.
        A block written from offset 0 starts afresh (what it held was a previous
        owner's); a block whose scale must grow has the codes it already holds
        re-rounded to the new scale.
        """
        touched, where = torch.unique(blocks, return_inverse=True)   # each block once
        need = rows.abs().amax(dim=-1).float() / QMAX                 # [N, Hkv] per row
        wanted = torch.zeros(len(touched), rows.shape[1], device=rows.device)
        wanted.scatter_reduce_(0, where[:, None].expand_as(need), need, "amax")
        first = torch.full((len(touched),), self.block_size, device=rows.device,
                           dtype=offsets.dtype)
        first.scatter_reduce_(0, where, offsets, "amin")               # lowest offset
        old = torch.where((first > 0)[:, None], scales[touched], 0.0)  # offset 0: fresh
        new = torch.maximum(old, wanted).clamp(min=SCALE_FLOOR)
        kept = pool[touched].float() * (old / new)[:, :, None, None]   # same if s kept
        pool[touched] = torch.round(kept).to(pool.dtype)
        scales[touched] = new
        codes = torch.round(rows.float() / new[where][:, :, None]).clamp(-QMAX, QMAX)
        pool[blocks, :, offsets] = codes.to(pool.dtype)

    def dequantize(self, pool: torch.Tensor, scales: torch.Tensor,
                   blocks: torch.Tensor) -> torch.Tensor:
        """Values of the blocks named by `blocks` (ids, any shape).

        Returns blocks.shape + [Hkv, block_size, head_dim], in self.read_dtype.
        """
        codes = pool[blocks].to(self.read_dtype)
        return codes * scales[blocks].to(self.read_dtype)[..., None, None]

    def copy_on_write(self, seq: int, index: int) -> None:
        """The paged cache's copy-on-write, and the copy gets the block's scales too."""
        block = self.tables[seq][index]
        PagedKVCache.copy_on_write(self, seq, index)     # copies the codes if shared
        fresh = self.tables[seq][index]
        if fresh != block:
            for scales in self.k_scales + self.v_scales:   # every layer, K and V
                scales[fresh] = scales[block]

    # ---- the write and read paths around them ----

    def store(self, layer: int, blocks: torch.Tensor, offsets: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor) -> None:
        """Quantize keys and values [N, Hkv, D] into their slots; never into a block someone else reads."""
        shared = [b for b in blocks.unique().tolist() if self.allocator.refcount(b) > 1]
        if shared:
            raise RuntimeError(f"writing into shared block(s) {shared} would requantize K/V another "
                               "sequence reads: reserve() must copy them first")
        self.quantize_into(self.k_pools[layer], self.k_scales[layer], blocks, offsets, keys)
        self.quantize_into(self.v_pools[layer], self.v_scales[layer], blocks, offsets, values)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Quantize k, v [B, Hkv, T, D] into the blocks of their positions; return kv_lens [B]."""
        if layer == 0:
            self.check_positions(positions)          # in reserved room, above the history
        valid = positions >= 0
        slots = slot_mapping(self.block_tables, positions, self.block_size)[valid]
        blocks, offsets = slots // self.block_size, slots % self.block_size
        self.store(layer, blocks, offsets, k.transpose(1, 2)[valid], v.transpose(1, 2)[valid])
        kv_lens = kv_lengths(positions, self.batch_lengths)
        if layer == len(self.k_pools) - 1:          # the last layer commits the new lengths
            for seq, n in zip(self.batch, kv_lens.tolist()):
                self.lengths[seq] = n
            self.batch_lengths = kv_lens
        return kv_lens

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        """Store k, v, then read each row's history back dequantized: ([B, Hkv, L, D] x 2, kv_lens)."""
        kv_lens = self.write(layer, k, v, positions)
        span = max(int(kv_lens.max()), 1)
        tables = self.block_tables[:, :blocks_needed(span, self.block_size)]
        return (self.history(self.dequantize(self.k_pools[layer], self.k_scales[layer], tables), span),
                self.history(self.dequantize(self.v_pools[layer], self.v_scales[layer], tables), span),
                kv_lens)

    def attend(self, layer: int, q, k, v, positions: torch.Tensor) -> torch.Tensor:
        """Store k, v, then attend q over the dequantized history (plain attention)."""
        keys, values, kv_lens = self.update(layer, k, v, positions)
        return reference_attention(q, keys.to(q.dtype), values.to(q.dtype), positions, kv_lens)

    @staticmethod
    def history(blocks: torch.Tensor, span: int) -> torch.Tensor:
        """[B, W, Hkv, bs, D] blocks in table order -> [B, Hkv, span, D], key j = position j."""
        batch, width, heads, size, dim = blocks.shape
        return blocks.permute(0, 2, 1, 3, 4).reshape(batch, heads, width * size, dim)[:, :, :span]

    # ---- swap carries the scales ----

    def swap_out(self, seq: int) -> int:
        """Swap out the codes as the paged cache does, and the scales of the same blocks beside them."""
        used = self.table(seq)[:blocks_needed(self.lengths[seq], self.block_size)]
        index = torch.tensor(used, dtype=torch.long, device=self.device)
        k_scales = torch.stack([s[index] for s in self.k_scales]).to("cpu")
        v_scales = torch.stack([s[index] for s in self.v_scales]).to("cpu")
        moved = super().swap_out(seq)
        saved = self.swapped[seq]
        self.swapped[seq] = QuantizedSwap(saved.length, saved.keys, saved.values, k_scales, v_scales)
        return moved

    def swap_in(self, seq: int) -> int:
        """Swap the codes back in as the paged cache does, then restore their blocks' scales."""
        saved = self.swapped.get(seq)
        moved = super().swap_in(seq)
        index = torch.tensor(self.tables[seq], dtype=torch.long, device=self.device)
        for layer in range(len(self.k_scales)):
            self.k_scales[layer][index] = saved.k_scales[layer].to(self.device)
            self.v_scales[layer][index] = saved.v_scales[layer].to(self.device)
        return moved

    # ---- accounting ----

    def bytes_per_token(self) -> float:
        """Bytes of pool per token slot, measured from the tensors: codes plus scales."""
        return (self.pool.nbytes + self.scales.nbytes) / (self.num_blocks * self.block_size)
