"""The benchmark's setup: the model (or the roofline clock), the KV budget in bytes, and one engine per policy."""
from __future__ import annotations

import torch

from engine.serve.contiguous import ContiguousKVCache
from engine.serve.engine import Engine
from engine.serve.scheduler import SchedulerConfig

KINDS = ("max", "pow2", "oracle", "paged")


def check_device(device: str) -> None:
    """Fail with a clear message when the asked-for device is not there."""
    if device == "cuda" and not torch.cuda.is_available():
        built = torch.version.cuda
        raise ValueError("--device cuda: no CUDA device is available here (torch "
                         f"{torch.__version__}, "
                         f"{'built for CUDA ' + built if built else 'a CPU-only build'}); "
                         "run it on a GPU machine, or use --device cpu or --simulate CONFIG --gpu NAME")


def random_model(config, device: str, dtype: torch.dtype, seed: int = 0):
    """A model of `config`'s shape with seeded random weights (PyTorch's default init), built on `device`."""
    from engine.model import Qwen3Model
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3Model(config)
    return model.to(dtype).eval()


class Setup:
    """What differs between a CPU run, a GPU run and a simulation: the model, its caches, its clock."""

    def __init__(self, args, simulate_as: tuple | None = None, budget: int | None = None):
        """Build the model (or the roofline) and the KV budget in bytes from the command line.

        `simulate_as=(config, name, gpu)` with `budget` builds the simulation that predicts a real GPU run.
        """
        self.args = args
        self.simulated = bool(args.simulate) or simulate_as is not None
        self.device = "cpu" if self.simulated else args.device
        # On a CPU every length is halved by default, which keeps the whole bench around a minute;
        # the ratios barely move (the simulator, at full length, finds the same concurrency ratios).
        self.scale = args.scale or (0.5 if self.device == "cpu" and not self.simulated else 1.0)
        self.prompt_len = tuple(max(1, round(n * self.scale)) for n in args.prompt_len)
        self.output_len = tuple(max(1, round(n * self.scale)) for n in args.output_len)
        self.max_len = max(1, round(args.max_len * self.scale))
        if self.simulated:
            from engine.serve import simulate
            config, config_name, gpu_name = simulate_as or (None, args.simulate, args.gpu or "H100-80GB")
            gpu = simulate.GPUS.get(gpu_name)
            if gpu is None:
                raise ValueError(f"unknown --gpu {gpu_name!r}; known: {', '.join(simulate.GPUS)}")
            self.config = config or simulate.load_config(config_name)
            self.roofline = simulate.Roofline(self.config, gpu, name=config_name)
            self.model, self.bytes_per_token = None, self.roofline.kv_bytes_per_token
            self.budget = budget if budget is not None else self.roofline.kv_budget_bytes()
            self.label = simulate.label(config_name, gpu)
            return
        check_device(self.device)
        if args.gpu is not None:
            from engine.serve.simulate import GPUS
            if args.gpu not in GPUS:
                raise ValueError(f"unknown --gpu {args.gpu!r}; known: {', '.join(GPUS)}")
        if self.device == "cpu":
            torch.set_num_threads(1)           # a tiny model: threads only add contention
        self.dtype = torch.float32 if self.device == "cpu" else torch.bfloat16
        if args.model_config:
            from engine.config import known_config
            self.config = known_config(args.model_config)
            self.model = random_model(self.config, self.device, self.dtype)
            what = f"{args.model_config}-shaped model with random weights"
        else:
            from engine.checkpoint import tiny_model
            # One layer and two query heads (over one KV head): a quarter of the tiny model's work,
            # so the four policies run in about a minute on a CPU.
            self.model = tiny_model(num_layers=1, num_heads=2, num_kv_heads=1).to(self.device, self.dtype)
            self.config = self.model.config
            what = "tiny seeded model cut to 1 layer and 2 heads"
        self.bytes_per_token = self.config.kv_bytes_per_token(self.dtype)
        self.budget = args.slots * self.max_len * self.bytes_per_token
        dtype = str(self.dtype).removeprefix("torch.")
        budget = f"KV budget = {args.slots} Max slots of {self.max_len} tokens"
        if not args.prefix:
            budget += ", so memory binds"
        if self.device == "cuda":
            card = torch.cuda.get_device_name()
            self.label = (f"MEASURED on {card}, {what}, {dtype}; {budget}. Eager PyTorch on padded ragged "
                          "batches: the roofline prediction printed next to it is an upper bound")
        elif args.prefix:
            self.label = (f"MEASURED on CPU, {what}, {dtype}; prefix workload as given "
                          f"({args.system_len}-token system prompt, 16-64 own tokens, 16 outputs; --scale "
                          f"does not apply to it); {budget}")
        else:
            self.label = (f"MEASURED on CPU, {what}, {dtype}; lengths scaled by {self.scale:g}; {budget}. "
                          "Decode rows run as one forward, prompt chunks in forwards of similar lengths (no "
                          "row padded to a decode's width); see --simulate for throughput on a GPU")

    def engine(self, kind: str, prefix_caching: bool = True) -> Engine:
        """A fresh Engine whose cache spends exactly the budget's bytes the `kind` way."""
        args, tokens = self.args, self.budget // self.bytes_per_token
        token_budget = args.token_budget or (256 if self.device == "cpu" and not self.simulated else 8192)
        config = SchedulerConfig(max_num_seqs=4096, max_batched_tokens=token_budget)
        if kind == "paged":
            blocks = tokens // args.block_size
            if self.simulated:
                from engine.serve.simulate import BookkeepingPagedCache
                cache = BookkeepingPagedCache(blocks, args.block_size)
            else:
                from engine.cache.paged import PagedKVCache
                cache = PagedKVCache(self.config, blocks, args.block_size, dtype=self.dtype,
                                     device=self.device)
        elif self.simulated:
            cache = ContiguousKVCache(self.config, tokens, kind, self.max_len, store=False)
        else:
            cache = ContiguousKVCache(self.config, tokens, kind, self.max_len, dtype=self.dtype,
                                      device=self.device)
        runner = None
        if self.simulated:
            from engine.serve.simulate import SimulatedRunner
            runner = SimulatedRunner(self.roofline, cache)
        return Engine(self.model, cache, config, prefix_caching=prefix_caching, runner=runner)
