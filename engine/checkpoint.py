"""Checkpoints in Hugging Face's layout: load a directory, or make a tiny seeded one with no download."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.errors import CheckpointError, MissingFileError
from engine.model import Qwen3Model

# Keys some exporters add that carry no weights of their own.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

TINY = ModelConfig(vocab_size=260, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16, intermediate_size=128, rms_norm_eps=1e-6, rope_theta=10_000.0,
                   tie_word_embeddings=False, max_position_embeddings=4096,
                   bos_token_id=256, eos_token_id=257)


# The tiny Qwen3 trained on the chapters' prose (engine/tools/train_tiny.py, `make tiny-model`): the
# model that writes text in `python -m engine generate` and the demos. The checks keep the seeded one.
TRAINED_DIR = Path(__file__).resolve().parent / "tiny_model"
TRAINED = ModelConfig(vocab_size=260, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                      head_dim=32, intermediate_size=384, rms_norm_eps=1e-6, rope_theta=10_000.0,
                      tie_word_embeddings=True, max_position_embeddings=4096,
                      bos_token_id=256, eos_token_id=257)


def trained_config() -> ModelConfig:
    """The trained tiny model's shape: 4 layers of width 128, a tied byte embedding."""
    return TRAINED


def trained_model(dtype: torch.dtype = torch.float32, device: str = "cpu") -> Qwen3Model:
    """The tiny Qwen3 trained on the course's prose, from engine/tiny_model/ (bfloat16 weights on disk)."""
    return load_model(TRAINED_DIR, dtype, device)


def tiny_config(**overrides) -> ModelConfig:
    """The course's tiny Qwen3 shape (2 layers, 4 query heads over 2 KV heads), with overrides."""
    return replace(TINY, **overrides)


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> Qwen3Model:
    """A tiny model with seeded random weights, scaled so its logits are far from ties."""
    model = Qwen3Model(tiny_config(**overrides))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:   # linear layers and the embedding (maybe tied to the head): keep activations O(1)
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)
    return model.to(dtype).eval()


def hf_state_dict(model: Qwen3Model) -> dict[str, torch.Tensor]:
    """The model's tensors under Hugging Face's key names (model.* plus lm_head)."""
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("lm_head."):
            if model.config.tie_word_embeddings:
                continue                      # tied: the checkpoint stores the embedding once
            tensors[name] = tensor.contiguous()
        else:
            tensors[f"model.{name}"] = tensor.contiguous()
    return tensors


def save_checkpoint(model: Qwen3Model, path: str | Path) -> Path:
    """Write config.json and model.safetensors, the way a Hugging Face Qwen3 checkpoint stores them."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2))
    save_file(hf_state_dict(model), str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def write_tiny_checkpoint(path: str | Path, seed: int = 0, **overrides) -> Path:
    """Make a tiny seeded checkpoint directory, so tests and notebooks need no download."""
    return save_checkpoint(tiny_model(seed, **overrides), path)


def read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    """One safetensors file; an empty, truncated or foreign file is an error that names it."""
    if not file.exists():
        raise MissingFileError(f"checkpoint file {file} does not exist")
    try:
        return load_file(str(file))
    except Exception as exc:   # safetensors raises its own SafetensorError (and OSError) for bad files
        raise CheckpointError(f"{file} is not a readable safetensors file "
                              f"({file.stat().st_size} bytes; {exc})") from None


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: one model.safetensors or a sharded index."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists():
        return read_safetensors(single)
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is not a safetensors index with a 'weight_map' ({exc})") from None
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(path / shard))
        return tensors
    raise MissingFileError(f"{path} has neither model.safetensors nor model.safetensors.index.json")


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Qwen3Model:
    """Load a Hugging Face Qwen3 checkpoint directory; every tensor is checked by name and shape."""
    path = Path(path)
    config = ModelConfig.from_json(path, strict=True)
    model = Qwen3Model(config)
    expected = hf_state_dict(model)
    found = {k: v for k, v in read_tensors(path).items() if not k.endswith(IGNORED_SUFFIXES)}
    if config.tie_word_embeddings and "lm_head.weight" in found:
        drop_tied_head(found, path)
    missing = sorted(set(expected) - set(found))
    if missing:
        shape = tuple(expected[missing[0]].shape)
        raise CheckpointError(f"checkpoint {path} lacks tensor {missing[0]!r} (shape {shape})"
                       + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise CheckpointError(f"checkpoint {path} has tensor {unexpected[0]!r} that a Qwen3 of this config "
                              "does not use")
    for key, tensor in found.items():
        if tensor.shape != expected[key].shape:
            raise CheckpointError(f"checkpoint tensor {key!r} has shape {tuple(tensor.shape)}, "
                             f"config.json implies {tuple(expected[key].shape)}")
    own = {key.removeprefix("model."): tensor for key, tensor in found.items()}
    model.load_state_dict(own, strict=not config.tie_word_embeddings)
    return model.to(device=device, dtype=dtype).eval()


def drop_tied_head(found: dict[str, torch.Tensor], path: Path) -> None:
    """A tied checkpoint that also stores lm_head.weight (transformers writes some so): keep it only
    when it is the embedding, since a tied model has one matrix for both."""
    head, embedding = found.pop("lm_head.weight"), found.get("model.embed_tokens.weight")
    if embedding is not None and (head.shape != embedding.shape or not torch.equal(head, embedding)):
        raise CheckpointError(f"checkpoint {path}: config.json says tie_word_embeddings = true, but the stored "
                              "lm_head.weight differs from model.embed_tokens.weight; set tie_word_embeddings "
                              "to false to use the stored head")
