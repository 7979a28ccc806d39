"""Serving a real model on a real GPU, simulated: the real scheduler and caches, a roofline clock.

Nothing here multiplies a matrix. The scheduler, the block allocator, the paged cache's bookkeeping
and the prefix cache all run for real, on a cache whose pool holds one number per token (so every
table, refcount, copy-on-write and swap is exercised); only the forward pass is replaced by a cost:

    step time = max(bytes moved / HBM bandwidth, FLOPs / peak FLOP/s)
    bytes     = weights (read once per step) + KV history read by every row + KV written
    FLOPs     = 2 * matmul params * tokens + 2 * hidden * vocab per sampled row
                + 4 * layers * q_heads * head_dim * (keys each new token attends to)
    swap      = blocks moved * block bytes / host-link bandwidth, added to the step

The runner also splits the modelled time into compute-bound, memory-bound and swapping, and the HBM
bytes into weights and KV: the bench's `paper_band` verdict reads them to say why a paged/static
throughput ratio lands where it does (engine/serve/README.md has the figures).

Every figure it prints is labelled a simulation: a roofline is an upper bound on speed, and the
ratios between two schedulers are what it is good for, not the absolute tokens per second.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from engine.cache.paged import PagedKVCache
from engine.config import ModelConfig, known_config
from engine.errors import InputError

GIB = 1024 ** 3


@dataclass(frozen=True)
class GPU:
    """Public spec-sheet figures (dense BF16, no sparsity); a laptop part is a class, not one SKU."""

    name: str
    memory_gb: float          # decimal GB, as sold
    hbm_gbps: float           # memory bandwidth, GB/s
    tflops: float             # dense BF16 tensor-core TFLOP/s
    host_gbps: float          # host link for swapping, GB/s each way (effective)


GPUS = {g.name: g for g in (
    GPU("H100-80GB", 80, 3350, 989, 50),        # SXM5, PCIe gen5 host link
    GPU("H200", 141, 4800, 989, 50),
    GPU("A100-80GB", 80, 2039, 312, 25),        # SXM4, PCIe gen4
    GPU("A100-40GB", 40, 1555, 312, 25),        # the vLLM paper's GPU
    GPU("laptop-8GB", 8, 256, 45, 12),          # an RTX 4060/4070-class laptop GPU (estimate)
)}
GPUS["A100"] = GPUS["A100-80GB"]

# A config.json by path, or a published model by name (engine/configs), e.g. "llama-3-8b".
load_config = known_config


class Roofline:
    """The cost of one engine step of `config` on `gpu`, from bytes and FLOPs alone."""

    def __init__(self, config: ModelConfig, gpu: GPU, dtype_bytes: int = 2, name: str | None = None):
        """Count the model's matmul parameters and weight and KV bytes once, from its config."""
        self.name = name
        c = config
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.layer_params = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
        self.matmul_params = c.num_layers * self.layer_params
        embeddings = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
        self.weight_bytes = (self.matmul_params + embeddings) * dtype_bytes
        self.kv_bytes_per_token = 2 * c.num_layers * kv * dtype_bytes
        self.head_flops = 2 * c.hidden_size * c.vocab_size
        self.attention_flops_per_key = 4 * c.num_layers * q
        self.config, self.gpu = config, gpu

    def step_seconds(self, rows: list[tuple[int, int, bool]], with_bound: bool = False):
        """Time of one forward over rows (start position, new tokens, samples a token?).

        With `with_bound`, also say which roof it hit: "compute_bound" or "memory_bound".
        """
        tokens = sum(count for _, count, _ in rows)
        keys = sum(count * start + count * (count + 1) // 2 for start, count, _ in rows)
        flops = (2 * self.matmul_params * tokens + self.head_flops * sum(s for *_, s in rows)
                 + self.attention_flops_per_key * keys)
        moved = self.weight_bytes + sum(start + count for start, count, _ in rows) * self.kv_bytes_per_token
        memory, compute = moved / (self.gpu.hbm_gbps * 1e9), flops / (self.gpu.tflops * 1e12)
        seconds = max(memory, compute)
        return (seconds, "compute_bound" if compute >= memory else "memory_bound") if with_bound else seconds

    def kv_budget_bytes(self, memory_fraction: float = 0.9, activation_gib: float = 1.0) -> int:
        """KV memory left on the GPU: a fraction of it, minus weights and an activation reserve."""
        budget = self.gpu.memory_gb * 1e9 * memory_fraction - self.weight_bytes - activation_gib * GIB
        if budget <= 0:
            raise InputError(f"{self.config_name()} does not fit on {self.gpu.name}: weights "
                             f"{self.weight_bytes / GIB:.1f} GiB + {activation_gib} GiB activations > "
                             f"{memory_fraction:.0%} of {self.gpu.memory_gb} GB")
        return int(budget)

    def config_name(self) -> str:
        """A short description of the model for error messages."""
        return self.name or f"a model of {self.matmul_params / 1e9:.2f}B matmul parameters"

    def constants(self) -> dict:
        """Every number the cost model uses, for the printed report."""
        return {"gpu": self.gpu.name, "hbm_GBps": self.gpu.hbm_gbps, "peak_TFLOPs": self.gpu.tflops,
                "host_link_GBps": self.gpu.host_gbps, "weight_bytes": self.weight_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token, "dtype_bytes": 2,
                "formula": "max((weights + KV read/written) / HBM, FLOPs / peak) + swap bytes / host link"}


class BookkeepingPagedCache(PagedKVCache):
    """The real PagedKVCache on a pool of one number per token: all bookkeeping, no real K/V.

    It also counts blocks swapped across the host link, so the simulator can charge for them.
    """

    def __init__(self, num_blocks: int, block_size: int = 16):
        """A pool of num_blocks blocks of one fp16 number per token, one layer, one head."""
        tiny = SimpleNamespace(num_layers=1, num_kv_heads=1, head_dim=1)
        super().__init__(tiny, num_blocks, block_size, dtype=torch.float16, attention="reference")
        self.blocks_moved = 0

    def swap_out(self, seq: int) -> int:
        """Swap out as the real cache does, and count the blocks that crossed the host link."""
        moved = super().swap_out(seq)
        self.blocks_moved += moved
        return moved

    def swap_in(self, seq: int) -> int:
        """Swap in as the real cache does, and count the blocks that crossed the host link."""
        moved = super().swap_in(seq)
        self.blocks_moved += moved
        return moved


class SimulatedRunner:
    """Stands in for ModelRunner: every sampled token is 0 and each step costs the roofline's time."""

    def __init__(self, roofline: Roofline, cache):
        """Cost steps with `roofline`; read swap traffic and commit lengths on `cache`."""
        self.roofline, self.cache = roofline, cache
        self.block_bytes = roofline.kv_bytes_per_token * getattr(cache, "block_size", 1)
        self.seconds = {"compute_bound": 0.0, "memory_bound": 0.0, "swapping": 0.0}
        self.bytes = {"weights": 0, "kv": 0}           # HBM traffic: what a bigger batch adds is KV

    def execute(self, chunks) -> tuple[torch.Tensor, float]:
        """No forward: zero logits (greedy picks token 0) and the modelled duration of the step."""
        for c in chunks:                                # what the last layer's update() would commit
            self.cache.set_length(c.seq.seq_id, c.start + c.count)
        rows = [(c.start, c.count, c.start + c.count == len(c.seq.tokens)) for c in chunks]
        seconds, bound = self.roofline.step_seconds(rows, with_bound=True)
        self.seconds[bound] += seconds
        self.bytes["weights"] += self.roofline.weight_bytes
        self.bytes["kv"] += sum(start + count for start, count, _ in rows) * self.roofline.kv_bytes_per_token
        moved = getattr(self.cache, "blocks_moved", 0)
        if moved:
            swapping = moved * self.block_bytes / (self.roofline.gpu.host_gbps * 1e9)
            self.seconds["swapping"] += swapping
            seconds += swapping
            self.cache.blocks_moved = 0
        return torch.zeros(len(chunks), 1), seconds

    def time_split(self) -> dict:
        """Fractions of the modelled time spent compute-bound, bandwidth-bound and swapping, and the
        share of HBM bytes that were KV (the rest: weights, read once per step whatever the batch)."""
        total = sum(self.seconds.values()) or 1.0
        split = {f"{name}_fraction": round(value / total, 3) for name, value in self.seconds.items()}
        moved = sum(self.bytes.values())
        split["kv_share_of_bytes"] = round(self.bytes["kv"] / moved, 3) if moved else 0.0
        return split


def gpu_for_device_name(device_name: str) -> str | None:
    """The GPUS entry for a torch.cuda.get_device_name() string, or None for a card not in the table."""
    name = device_name.upper()
    if "H200" in name:
        return "H200"
    if "H100" in name:
        return "H100-80GB"
    if "A100" in name:
        return "A100-40GB" if "40G" in name else "A100-80GB"
    if "LAPTOP" in name:
        return "laptop-8GB"
    return None


def label(config_name: str, gpu: GPU) -> str:
    """The line every simulated result carries, so nobody mistakes it for a measurement."""
    return (f"SIMULATION (roofline, not measured): {config_name} on {gpu.name}; real scheduler, "
            "allocator and prefix cache, modelled step times")
