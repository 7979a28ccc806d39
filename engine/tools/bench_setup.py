"""The benchmark's setup: the model (or the roofline clock), the KV budget in bytes, and one engine per policy."""
from __future__ import annotations

import torch

from engine.tools.cli_args import check_memory
from engine.errors import InputError
from engine.tools.contiguous import ContiguousKVCache
from engine.serve.engine import Engine
from engine.serve.scheduler import SchedulerConfig
from engine.tools.workloads import MIXES, PREFIX_OUTPUT, PREFIX_OWN_MAX, check_mix

KINDS = ("max", "pow2", "oracle", "paged")


def check_device(device: str) -> None:
    """Fail with a clear message when the asked-for device is not there."""
    if device == "cuda" and not torch.cuda.is_available():
        built = torch.version.cuda
        raise InputError("--device cuda: no CUDA device is available here (torch "
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


def scaled(length: int, scale: float) -> int:
    """A length times --scale, at least 1 token."""
    return max(1, round(length * scale))


class Setup:
    """What differs between a CPU run, a GPU run and a simulation: the model, its caches, its clock."""

    def __init__(self, args, simulate_as: tuple | None = None, budget: int | None = None):
        """Build the model (or the roofline) and the KV budget in bytes from the command line.

        Everything the options imply is checked (`check`) before the model is built.
        `simulate_as=(config, name, gpu)` with `budget` builds the simulation that predicts a real GPU run.
        """
        self.args = args
        self.simulated = bool(args.simulate) or simulate_as is not None
        self.device = "cpu" if self.simulated else args.device
        # On a CPU every length is halved by default, which keeps the whole bench around a minute;
        # the ratios barely move (the simulator, at full length, finds the same concurrency ratios).
        default_scale = 0.5 if self.device == "cpu" and not self.simulated else 1.0
        self.scale = default_scale if args.scale is None else args.scale
        self.prompt_len = tuple(scaled(n, self.scale) for n in args.prompt_len)
        self.output_len = tuple(scaled(n, self.scale) for n in args.output_len)
        self.max_len = scaled(args.max_len, self.scale)
        self.max_len_given = f"--max-len {args.max_len}" + (
            "" if self.max_len == args.max_len else f" x --scale {self.scale:g} = {self.max_len}")
        if self.simulated:
            from engine.tools import simulate
            config, config_name, gpu_name = simulate_as or (None, args.simulate, args.gpu or "H100-80GB")
            gpu = simulate.GPUS.get(gpu_name)
            if gpu is None:
                raise InputError(f"unknown --gpu {gpu_name!r}; known: {', '.join(simulate.GPUS)}")
            self.config = config or simulate.load_config(config_name)
            self.roofline = simulate.Roofline(self.config, gpu, name=config_name)
            self.model, self.bytes_per_token = None, self.roofline.kv_bytes_per_token
            self.budget = budget if budget is not None else self.roofline.kv_budget_bytes()
            self.label = simulate.label(config_name, gpu)
            self.check()
            return
        check_device(self.device)
        self.dtype = torch.float32 if self.device == "cpu" else torch.bfloat16
        if args.model_config:
            from engine.config import known_config
            self.config = known_config(args.model_config)
            what = f"{args.model_config}-shaped model with random weights"
        else:
            from engine.checkpoint import tiny_config
            # One layer and two query heads (over one KV head): a quarter of the tiny model's work,
            # so the four policies run in about a minute on a CPU.
            self.config = tiny_config(num_layers=1, num_heads=2, num_kv_heads=1)
            what = "tiny seeded model cut to 1 layer and 2 heads"
        self.bytes_per_token = self.config.kv_bytes_per_token(self.dtype)
        self.budget = args.slots * self.max_len * self.bytes_per_token
        self.check()
        self.model = self.build_model()
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

    def build_model(self):
        """The real run's model: random weights of --model-config's shape, or the tiny model cut down."""
        if self.device == "cpu":
            torch.set_num_threads(1)           # a tiny model: threads only add contention
        if self.args.model_config:
            return random_model(self.config, self.device, self.dtype)
        from engine.checkpoint import tiny_model
        return tiny_model(num_layers=1, num_heads=2, num_kv_heads=1).to(self.device, self.dtype)

    # ---- what the options imply, checked before anything is built or run ----

    def longest_request(self) -> tuple[int, str]:
        """The final length (prompt + output) of the longest request the workload may hold, described."""
        args = self.args
        if args.prefix:
            return args.system_len + PREFIX_OWN_MAX + PREFIX_OUTPUT, \
                f"--system-len {args.system_len} + up to {PREFIX_OWN_MAX} own tokens + {PREFIX_OUTPUT} outputs"
        if args.workload != "uniform":
            return self.max_len, f"a {args.workload} pair, at most {self.max_len_given}"
        return (self.prompt_len[1] + self.output_len[1],
                f"--prompt-len MAX {self.prompt_len[1]} + --output-len MAX {self.output_len[1]}"
                + ("" if self.scale == 1 else f" (scaled by {self.scale:g})"))

    def capacity(self, kind: str) -> int:
        """The most KV positions one request can get under `kind` with this budget (what the scheduler
        will check on arrival), computed without allocating a pool."""
        tokens = self.budget // self.bytes_per_token
        if kind == "paged":
            return tokens // self.args.block_size * self.args.block_size
        return ContiguousKVCache(self.config, tokens, kind, self.max_len, store=False).max_request_tokens

    def requests(self) -> int:
        """How many requests the run serves: --requests, else 256 (64 for --prefix); a simulation of a
        big pool gets enough to keep it full for most of the run, or nothing binds."""
        args = self.args
        if args.requests is not None:
            return args.requests
        if args.prefix:
            return 64
        if not self.simulated:
            return 256
        if args.workload == "uniform":
            prompt_mean, output_mean = sum(self.prompt_len) / 2, sum(self.output_len) / 2
        else:
            prompt_mean, output_mean = (m * self.scale for m in MIXES[args.workload])
        live = prompt_mean + output_mean / 2 + args.block_size / 2
        return max(256, 2 * int(self.budget // self.bytes_per_token / live))

    def check(self) -> None:
        """Refuse what the options imply and no run could do, each with the options to change.

        The longest request must fit the model's trained context and every policy's share of the KV
        budget; a paper mix must be drawable under --max-len; a real run must fit in memory.
        """
        args, context = self.args, self.config.max_position_embeddings
        final, what = self.longest_request()
        written = final - 1                    # the last sampled token is never stored
        if written > context:
            raise InputError(f"the longest request ({what} = {final} tokens) reaches position {written}, past "
                             f"the model's trained context of {context} (max_position_embeddings): lower "
                             "the lengths, --max-len or --scale")
        if not args.prefix and args.workload != "uniform":
            check_mix(args.workload, self.max_len, self.scale, self.max_len_given)
        budget = (f"the KV budget of {self.budget // self.bytes_per_token} tokens" if self.simulated else
                  f"the KV budget of --slots {args.slots} x ({self.max_len_given}) tokens")
        for kind in ["paged"] if args.prefix else args.kinds:
            room = self.capacity(kind)
            if written > room:
                how = {"paged": f"in blocks of --block-size {args.block_size}", "max": f"in slots of {self.max_len}",
                       "pow2": "in regions of a power of two", "oracle": "in exact regions"}
                raise InputError(f"--kinds {kind}: {budget}, {how[kind]}, holds requests of at most {room} "
                                 f"positions, but the longest request ({what} = {final} tokens) needs {written}: "
                                 "raise --slots or lower the lengths" + (" or --block-size" if kind == "paged"
                                                                         else ""))
        workload_bytes = self.requests() * final * 8        # the prompts' token lists, before any run
        if self.simulated:
            check_memory(workload_bytes, f"--requests {self.requests()} requests of up to {final} tokens")
            return
        from engine.tools.simulate import Roofline
        weights = Roofline(self.config, None, self.dtype.itemsize).weight_bytes
        total = None if self.device == "cpu" else torch.cuda.get_device_properties(0).total_memory
        check_memory(2 * self.budget + weights + (workload_bytes if self.device == "cpu" else 0),
                     f"the model ({weights / 2**30:.2f} GiB of weights) and two engines' KV pools (--slots "
                     f"{args.slots} x ({self.max_len_given}) tokens x {self.bytes_per_token} bytes)",
                     total=total)

    def engine(self, kind: str, prefix_caching: bool = True) -> Engine:
        """A fresh Engine whose cache spends exactly the budget's bytes the `kind` way."""
        args, tokens = self.args, self.budget // self.bytes_per_token
        token_budget = args.token_budget
        if token_budget is None:
            token_budget = 256 if self.device == "cpu" and not self.simulated else 8192
        config = SchedulerConfig(max_num_seqs=4096, max_batched_tokens=token_budget)
        if kind == "paged":
            blocks = tokens // args.block_size
            if self.simulated:
                from engine.tools.simulate import BookkeepingPagedCache
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
            from engine.tools.simulate import SimulatedRunner
            runner = SimulatedRunner(self.roofline, cache)
        return Engine(self.model, cache, config, prefix_caching=prefix_caching, runner=runner)
