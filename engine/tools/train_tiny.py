"""`make tiny-model`: train the course's tiny Qwen3 on the chapters' own prose, from a seed, on the CPU.

The same seed, corpus and settings give the same weights: one thread, deterministic kernels, batches
drawn in a fixed order from a seeded generator, and the CPU kernels pinned to one instruction set (AVX2), so
a machine with AVX-512 and one without compute the same sums (see PINNED). The model is trained with
transformers' Qwen3 (the engine's forward runs in inference mode) and saved in Hugging Face's layout,
which both load. The corpus (engine/tiny_model/corpus.txt) was written once by `--make-corpus` from
solutions/, so later edits to the chapters do not change what this trains on.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.checkpoint import TRAINED_DIR, trained_config

RECORD = "training.json"   # the run's settings, its logged losses and the checkpoint's sha256

# MKL's matrix products and ATen's vectorised loops each pick kernels by the CPU's widest instructions, and
# AVX-512 sums in another order than AVX2: by step 60 the losses part in the sixth digit, and the weights'
# bytes differ. These variables, read when torch loads, pin both (and oneDNN) to AVX2 on any x86-64 CPU
# that has it. STRICT makes MKL's results independent of how the arrays happen to be aligned.
PINNED = {"MKL_CBWR": "AVX2,STRICT", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@dataclass(frozen=True)
class Settings:
    """What one training run is: change any of these and the checkpoint changes."""

    seed: int = 0
    steps: int = 1200
    batch: int = 16
    context: int = 128
    lr: float = 4e-3
    warmup: int = 30
    weight_decay: float = 0.01


def prose(source: str) -> str:
    """The markdown cells of a percent-format chapter, code blocks and tables removed, ASCII only."""
    cells = re.split(r"^# %%", source, flags=re.M)[1:]
    paragraphs = []
    for cell in cells:
        head, _, body = cell.partition("\n")
        if not head.startswith(" [markdown]"):
            continue
        text = "\n".join(line[2:] if line.startswith("# ") else line[1:]
                         for line in body.splitlines() if line.startswith("#"))
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for block in re.split(r"\n\s*\n", text):
            lines = [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("|")]
            if lines:
                paragraphs.append(" ".join(lines))
    text = "\n\n".join(paragraphs)
    for old, new in {"\u2014": " - ", "\u2013": "-", "\u00a7": "section ", "**": "", "$": ""}.items():
        text = text.replace(old, new)
    return text.encode("ascii", errors="ignore").decode("ascii")


def make_corpus(solutions: Path, out: Path) -> None:
    """Write corpus.txt once from the chapters' prose (kept as a committed file afterwards)."""
    text = "\n\n".join(prose(path.read_text()) for path in sorted(solutions.glob("ch*.py")))
    out.write_text(text + "\n")
    print(f"{out}: {len(text):,} bytes of prose from {len(list(solutions.glob('ch*.py')))} chapters")


def batches(data: torch.Tensor, settings: Settings):
    """Random windows of context + 1 bytes, in the order a generator seeded by `seed` draws them."""
    generator = torch.Generator().manual_seed(settings.seed)
    for _ in range(settings.steps):
        starts = torch.randint(0, len(data) - settings.context - 1, (settings.batch,), generator=generator)
        windows = torch.stack([data[s:s + settings.context + 1] for s in starts.tolist()])
        yield windows[:, :-1], windows[:, 1:]


def learning_rate(step: int, settings: Settings) -> float:
    """Linear warm-up, then a cosine down to a tenth of the peak."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    done = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def hf_model(seed: int):
    """transformers' Qwen3 of the trained config, initialised from `seed`."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(**trained_config().to_hf())
    return transformers.Qwen3ForCausalLM(config).float().train()


def train(corpus: Path, settings: Settings, progress: bool = True):
    """Train from the seed, on one thread with deterministic kernels (both restored after); returns the
    model and the loss of every step."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        return run_steps(corpus, settings, progress)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def run_steps(corpus: Path, settings: Settings, progress: bool):
    """The training loop itself (see train)."""
    from tqdm import tqdm
    data = torch.tensor(list(corpus.read_bytes()), dtype=torch.long)
    model = hf_model(settings.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=settings.lr, betas=(0.9, 0.95))
    losses = []
    live = progress and sys.stderr.isatty()          # a bar on a terminal; in a log, a line per 100 steps
    bar = tqdm(batches(data, settings), total=settings.steps, disable=not live, mininterval=2.0)
    for step, (inputs, targets) in enumerate(bar):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if progress and (step + 1) % 100 == 0:
            bar.write(f"step {step + 1}/{settings.steps}: loss {sum(losses[-100:]) / 100:.4f} (mean of the last 100)")
    return model.eval(), losses


def save(model, out: Path) -> Path:
    """config.json and model.safetensors (bfloat16) in Hugging Face's layout; returns the weights file."""
    from safetensors.torch import save_file
    hf = trained_config().to_hf() | {"torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    tensors = {name: tensor.detach().to(torch.bfloat16).contiguous()
               for name, tensor in model.state_dict().items() if name != "lm_head.weight"}   # tied head
    weights = out / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return weights


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def has_avx2() -> bool:
    """Whether this CPU can run the pinned kernels (x86-64 with AVX2; Linux says so in /proc/cpuinfo)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.system() in ("Windows", "Darwin")     # no /proc there; recent x86 Macs and PCs have it


def pinned_or_restart(argv: list[str]) -> None:
    """Run again in a fresh interpreter with PINNED set, unless it already is (torch reads them at load)."""
    if all(os.environ.get(name) == value for name, value in PINNED.items()):
        return
    if not has_avx2():
        print("this CPU has no AVX2: the kernels are not pinned, so the losses agree with training.json to "
              "about 1e-4 but the weights' sha256 will differ")
        return
    print("pinning the CPU kernels to AVX2 (" + " ".join(f"{k}={v}" for k, v in PINNED.items()) + ")", flush=True)
    os.execve(sys.executable, [sys.executable, "-m", "engine.tools.train_tiny", *argv], os.environ | PINNED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.train_tiny", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TRAINED_DIR, help="folder to write (default: engine/tiny_model)")
    parser.add_argument("--steps", type=int, default=Settings.steps)
    parser.add_argument("--make-corpus", action="store_true",
                        help="write corpus.txt from solutions/ and stop (done once; the corpus is committed)")
    args = parser.parse_args(argv)
    corpus = TRAINED_DIR / "corpus.txt"
    if args.make_corpus:
        make_corpus(Path(__file__).resolve().parents[2] / "solutions", corpus)
        return 0
    pinned_or_restart(sys.argv[1:] if argv is None else argv)
    settings = Settings(steps=args.steps)
    print(f"training the tiny Qwen3 on {corpus} ({corpus.stat().st_size:,} bytes), {settings}; one CPU thread")
    started, cpu = time.perf_counter(), time.process_time()
    model, losses = train(corpus, settings)
    args.out.mkdir(parents=True, exist_ok=True)
    weights = save(model, args.out)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    record = {"settings": settings.__dict__, "corpus_sha256": sha256(corpus), "first_losses": losses[:5],
              "final_loss": sum(losses[-50:]) / 50, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
              "model_sha256": sha256(weights), "model_bytes": weights.stat().st_size,
              "kernels": {name: os.environ.get(name) for name in PINNED}, "torch": torch.__version__}
    (args.out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(f"done in {seconds:.0f} s ({cpu:.0f} s of CPU; longer on a shared machine): final loss "
          f"{record['final_loss']:.4f} (mean of the last 50 steps); {weights} {record['model_bytes']:,} bytes, "
          f"sha256 {record['model_sha256'][:16]}...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
