"""The baselines paging is measured against: one contiguous region of KV per sequence.

All three carve regions out of one pool of token slots and differ only in how big a region they ask
for when a sequence is admitted (the vLLM paper's baselines, Kwon et al. 2023, section 6):

  "max"     the longest any request may be (e.g. 1,024): StaticKVCache's slots, no external holes
  "pow2"    the sequence's true final length rounded up to a power of two
  "oracle"  exactly the true final length, which a real server cannot know in advance

A region is reserved whole at admission (`reserves_up_front`), which is why a contiguous cache needs
the final length up front. Variable sizes also leave holes between live regions (external
fragmentation): a region fails when no single hole is big enough, even if the free total would be.
"""
from __future__ import annotations

import torch

from engine.cache.errors import CacheFull
from engine.cache.protocol import new_lengths

POLICIES = ("max", "pow2", "oracle")


class ContiguousKVCache:
    """KV in one pool `[pool_tokens, kv_heads, head_dim]` per layer; each sequence owns a region of it."""

    reserves_up_front = True

    def __init__(self, config, pool_tokens: int, policy: str = "max", max_len: int = 1024,
                 dtype: torch.dtype = torch.float32, device="cpu", store: bool = True):
        """`store=False` keeps only the bookkeeping (no tensors): what the simulator needs."""
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if pool_tokens < 1 or max_len < 1:
            raise ValueError(f"pool_tokens and max_len must be positive, got {pool_tokens} and {max_len}")
        self.policy, self.max_len, self.pool_tokens = policy, max_len, pool_tokens
        shape = (pool_tokens, config.num_kv_heads, config.head_dim)
        layers = config.num_layers if store else 0
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.holes: list[tuple[int, int]] = [(0, pool_tokens)]     # free (start, size), sorted by start
        self.regions: dict[int, tuple[int, int]] = {}              # seq -> (start, size)
        self.lengths: dict[int, int] = {}
        self.batch: list[int] = []

    @property
    def max_request_tokens(self) -> int:
        """The most KV positions one sequence could ever write, so that a request past it is refused on
        arrival instead of waiting forever. A region is sized for the final length, one more than the
        positions written (the last sampled token is never stored), and it must fit in the pool."""
        if self.policy == "max":
            return self.max_len if self.max_len <= self.pool_tokens else 0
        largest = self.pool_tokens if self.policy == "oracle" else 1 << (self.pool_tokens.bit_length() - 1)
        return min(self.max_len, largest - 1)

    def region_size(self, max_length: int) -> int:
        """How many slots the policy reserves for a sequence that will reach `max_length` tokens."""
        if self.policy == "max":
            return self.max_len
        if self.policy == "pow2":
            return 1 << max(0, max_length - 1).bit_length()
        return max_length

    def create(self, seq: int, max_length: int | None = None) -> None:
        """Reserve seq's whole region now (first fit); CacheFull names the sizes when no hole fits."""
        if seq in self.regions:
            raise ValueError(f"sequence {seq} already exists")
        size = self.region_size(self.max_len if max_length is None else max_length)
        for index, (start, hole) in enumerate(self.holes):
            if hole >= size:
                self.holes[index:index + 1] = [(start + size, hole - size)] if hole > size else []
                self.regions[seq], self.lengths[seq] = (start, size), 0
                return
        largest = max((h for _, h in self.holes), default=0)
        raise CacheFull(f"no contiguous hole of {size} slots for sequence {seq}: largest hole {largest}, "
                        f"{sum(h for _, h in self.holes)} slots free in total")

    def reserve(self, seq: int, num_new: int) -> None:
        """Check the region still has room (a region never grows)."""
        start, size = self.regions[seq]
        if self.lengths[seq] + num_new > size:
            raise CacheFull(f"sequence {seq} holds {self.lengths[seq]} tokens; {num_new} more exceed "
                            f"its region of {size}")

    def set_batch(self, seqs) -> None:
        """Name the sequences of the next forward, in row order."""
        self.batch = list(seqs)

    def update(self, layer, k, v, positions):
        """Write new K/V at region start + position; return each row's history [B, Hkv, L, D]."""
        starts = torch.tensor([self.regions[s][0] for s in self.batch], device=k.device)
        valid = positions >= 0
        slots = (starts[:, None] + positions)[valid]
        self.k[layer][slots] = k.transpose(1, 2)[valid].to(self.k[layer].dtype)
        self.v[layer][slots] = v.transpose(1, 2)[valid].to(self.v[layer].dtype)
        lengths = new_lengths(positions, [self.lengths[s] for s in self.batch])
        if layer == len(self.k) - 1:
            self.lengths.update(zip(self.batch, lengths))
        span = max(lengths)
        kv_lens = torch.tensor(lengths, device=k.device)
        history = torch.arange(span, device=k.device)
        index = starts[:, None] + torch.minimum(history[None, :], (kv_lens - 1).clamp(min=0)[:, None])
        return (self.k[layer][index].transpose(1, 2), self.v[layer][index].transpose(1, 2), kv_lens)

    def free(self, seq: int) -> None:
        """Give the region back, merging it with neighbouring holes."""
        start, size = self.regions.pop(seq)
        del self.lengths[seq]
        holes = sorted(self.holes + [(start, size)])
        merged = [holes[0]]
        for s, h in holes[1:]:
            last_start, last_size = merged[-1]
            if last_start + last_size == s:
                merged[-1] = (last_start, last_size + h)
            else:
                merged.append((s, h))
        self.holes = merged

    def length(self, seq: int) -> int:
        """Tokens stored for seq."""
        return self.lengths[seq]

    def set_length(self, seq: int, length: int) -> None:
        """Record that seq's first `length` positions hold K/V written without update (a simulation)."""
        if not 0 <= length <= self.regions[seq][1]:
            raise ValueError(f"sequence {seq}: length {length} is outside its region of "
                             f"{self.regions[seq][1]} slots")
        self.lengths[seq] = length

    def reserved(self, seq: int) -> int:
        """Slots reserved for seq (its region's size)."""
        return self.regions[seq][1]

    def utilization(self) -> float:
        """Tokens stored / slots reserved by live sequences."""
        reserved = sum(size for _, size in self.regions.values())
        return sum(self.lengths.values()) / reserved if reserved else 0.0
