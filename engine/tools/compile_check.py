"""Compile the engine's Triton kernels for a GPU on any machine: Triton's compiler needs no GPU.

Triton's interpreter (how the kernels run on a CPU) accepts code the GPU compiler rejects: a tl.dot
under 16, loop-carried values whose dtype changes, an unknown launch option. This command runs
without the interpreter, replaces every kernel launch by a compilation for a chosen target (sm_90:
H100/H200; sm_80: A100), and drives the engine's real launchers (`paged_decode`, `paged_prefill`,
`paged_decode_per_head`) with CPU tensors of the dtypes and strides a GPU run would pass. So each
variant is compiled exactly as a launch would compile it (same specialization, same
do_not_specialize), down to the cubin, whose register and spill counts come from cuobjdump.

    python -m engine.tools.compile_check [--arch 90] [--quick]

prints one JSON line per compiled variant and exits 1 if any fails to compile. It runs in its own
process (`run_in_subprocess`), because a process that has defined its kernels for the interpreter
cannot define them again for a GPU.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from engine.tools.cli_args import Parser, shown
from engine.blocks import ceil_div

ARCHES = {70: "V100", 75: "T4", 80: "A100", 86: "A10/RTX 30", 89: "L4/L40", 90: "H100/H200", 100: "B200",
          120: "RTX 50"}
# The NVIDIA compute capabilities (x 10) that exist and that this Triton compiles the kernels for; any other
# number reaches LLVM as an unknown processor and aborts the process (sm_95), or fails inside it (sm_101).
REAL_ARCHES = (70, 72, 75, 80, 86, 87, 89, 90, 100, 103, 110, 120)


def arch(text: str) -> int:
    """An argparse type: one of REAL_ARCHES."""
    import argparse
    try:
        value = int(text)
    except ValueError:
        value = None
    if value not in REAL_ARCHES:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a GPU architecture Triton compiles for: one of "
                                         f"{', '.join(map(str, REAL_ARCHES))} (compute capability x 10)")
    return value


def _compile_mode(arch: int, records: list[dict]) -> None:
    """Make every JITFunction launch compile for `arch` instead of running (this process only)."""
    import engine.attention.triton_setup as attention  # prepare_triton looks the switch up there
    os.environ.pop("TRITON_INTERPRET", None)
    attention.use_interpreter_without_gpu = lambda: False
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    seen: set[str] = set()

    def run(self, *args, grid, warmup, **kwargs):
        binder = self.__dict__.get("_compile_check_binder")
        if binder is None:
            binder = self._compile_check_binder = create_function_from_signature(self.signature, self.params,
                                                                                 backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
        key = repr((self.fn.__name__, sorted(signature.items()), sorted(constexprs.items()), attrs,
                    options.num_warps, options.num_stages))
        if key in seen:
            return None
        seen.add(key)
        names = [p.name for p in self.params]
        record = {"kernel": self.fn.__name__, "arch": f"sm_{arch}",
                  "constexprs": {names[path[0]]: value for path, value in constexprs.items()
                                 if not isinstance(value, (type(None),))},
                  "num_warps": options.num_warps, "num_stages": options.num_stages}
        started = time.perf_counter()
        try:
            compiled = compile(ASTSource(self, signature, constexprs, attrs), target=target,
                               options=options.__dict__)
        except Exception as exc:  # noqa: BLE001 - a failed compilation is what this command reports
            record.update(ok=False, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
        else:
            record.update(ok=True, seconds=round(time.perf_counter() - started, 2),
                          shared_bytes=compiled.metadata.shared, **resource_usage(compiled.asm["cubin"]),
                          vector_loads=len(re.findall(r"ld\.global(?:\.\w+)*\.v[248]", compiled.asm["ptx"])))
        records.append(record)
        print(json.dumps(record), flush=True)
        return None

    JITFunction.run = run


def resource_usage(cubin: bytes) -> dict:
    """Registers, spill stack and local memory per thread of a cubin, read with the cuobjdump Triton ships."""
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([str(tool), "--dump-resource-usage", str(path)], capture_output=True,
                              text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    if not found:
        return {}
    regs, stack, local = (int(x) for x in found.groups())
    return {"registers": regs, "spill_stack_bytes": stack, "local_bytes": local}


def pool_case(batch: int, lens: list[int], kv_heads: int, head_dim: int, block_size: int, dtype, group: int,
              steps: int = 1):
    """CPU tensors shaped as the engine passes them (contiguous pools, tables, positions), values unused."""
    blocks = sum(ceil_div(n, block_size) for n in lens) + 1
    pool = (blocks, kv_heads, block_size, head_dim)
    k_pool, v_pool = torch.zeros(pool, dtype=dtype), torch.zeros(pool, dtype=dtype)
    tables = torch.zeros(batch, max(ceil_div(n, block_size) for n in lens) + 3, dtype=torch.long)
    kv_lens = torch.tensor(lens)
    q = torch.zeros(batch, kv_heads * group, steps, head_dim, dtype=dtype)
    positions = (kv_lens - steps)[:, None] + torch.arange(steps)[None, :]
    return q, k_pool, v_pool, tables, positions, kv_lens


def drive(quick: bool) -> None:
    """Call the launchers on the shapes the engine, the benchmark and the chapter use."""
    from engine.attention import triton_decode, triton_prefill
    from engine.attention.decode_config import candidates
    triton_decode.check_runnable = triton_prefill.check_runnable = lambda *args: None  # CPU tensors stand in
    qwen = dict(kv_heads=8, head_dim=128, block_size=16, group=2)                          # Qwen3-0.6B
    lens = [1, 15, 16, 17, 33, 4097]
    for dtype in (torch.float16,) if quick else (torch.float16, torch.bfloat16, torch.float32):
        args = pool_case(len(lens), lens, dtype=dtype, **qwen)
        for splits in (1, 4):
            triton_decode.paged_decode(*args, num_splits=splits)
    if quick:
        args = pool_case(len(lens), lens, dtype=torch.float16, **qwen)
        from engine.attention.decode_config import DecodeConfig
        triton_decode.paged_decode(*args, num_splits=4, config=DecodeConfig(64, "dot"))
        triton_prefill.paged_prefill(*pool_case(2, [300, 40], dtype=torch.float16, steps=40, **qwen))
        return
    args = pool_case(len(lens), lens, dtype=torch.float16, **qwen)
    for config in candidates("float16", 128, 2):
        for splits in (1, 4):
            triton_decode.paged_decode(*args, num_splits=splits, config=config)
    for group, head_dim, block_size in ((8, 128, 16), (1, 64, 8), (4, 64, 32), (16, 128, 16), (2, 128, 5)):
        for dtype in (torch.float16, torch.bfloat16):
            shape = dict(kv_heads=2, head_dim=head_dim, block_size=block_size, group=group)
            triton_decode.paged_decode(*pool_case(3, [3, 300, 2000], dtype=dtype, **shape), num_splits=2)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        triton_prefill.paged_prefill(*pool_case(2, [300, 40], dtype=dtype, steps=40, **qwen))
    args = pool_case(4, [5, 40, 300, 4096], dtype=torch.float16, **qwen)
    triton_decode.paged_decode_per_head(*args)


def main(argv: list[str] | None = None) -> int:
    """Compile every variant for --arch; 1 if one fails."""
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=arch, default=90,
                        help="compute capability x 10: 90 H100/H200 (default), 80 A100, 89 L4; one of "
                        f"{', '.join(map(str, REAL_ARCHES))}")
    parser.add_argument("--quick", action="store_true", help="the engine's Qwen3-0.6B decode and prefill only")
    args = parser.parse_args(argv)
    records: list[dict] = []
    _compile_mode(args.arch, records)
    drive(args.quick)
    failed = [r for r in records if not r["ok"]]
    spilled = [r for r in records if r.get("spill_stack_bytes") or r.get("local_bytes")]
    print(json.dumps({"arch": f"sm_{args.arch}", "card": ARCHES.get(args.arch, "unknown"),
                      "compiled": len(records) - len(failed), "failed": len(failed), "spilling": len(spilled)}))
    return 1 if failed else 0


def run_in_subprocess(*argv: str, timeout: float = 600) -> tuple[int, list[dict]]:
    """Run this command in a fresh process (no interpreter); its exit status and its JSON lines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "engine.tools.compile_check", *argv], capture_output=True,
                            text=True, timeout=timeout, env=env)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode not in (0, 1):
        raise RuntimeError(f"compile_check crashed (status {result.returncode}): {result.stderr[-2000:]}")
    return result.returncode, lines


if __name__ == "__main__":
    sys.exit(main())
