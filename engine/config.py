"""ModelConfig: the handful of numbers that fix a Qwen3-style model, read from a HF config.json."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.errors import InputError, MissingFileError

# config.json fields the engine reads, with the type each must have.
INT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "max_position_embeddings")
FLOAT_FIELDS = ("rms_norm_eps", "rope_theta")
# The dataclass's short names for config.json's fields, for messages.
HF_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads"}
# RoPE rotates each query and key in pairs of dimensions (the first half against the second). An odd
# head_dim is a fine shape for byte arithmetic (chapter 1), so the model and strict loading refuse it.
ROPE_NEEDS_EVEN = "rotary position embeddings rotate pairs of dimensions, so head_dim must be even"

@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer with grouped-query attention (Qwen3 / Llama family)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40_960
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise InputError(f"config: {HF_NAMES.get(name, name)} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"config: num_attention_heads {self.num_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_kv_heads}")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise InputError(f"config: rope_theta must be a finite number > 0, got {self.rope_theta}")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps >= 0):
            raise InputError(f"config: rms_norm_eps must be a finite number >= 0, got {self.rms_norm_eps}")
        if self.max_position_embeddings < 1:
            raise InputError(f"config: max_position_embeddings must be positive, got "
                             f"{self.max_position_embeddings}")

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.float16) -> int:
        """Bytes of KV cache one token costs in `dtype` (see the function kv_bytes_per_token)."""
        return kv_bytes_per_token(self, torch.empty((), dtype=dtype).element_size())

    @classmethod
    def from_hf(cls, hf: dict, source: str = "config.json") -> "ModelConfig":
        """Read the fields of a Hugging Face config.json dict (Qwen3 or Llama style).

        `source` names the file in error messages. Only the shape is read here: `check_supported`
        says whether the engine can run the model as the config describes it.
        """
        if not isinstance(hf, dict):
            raise InputError(f"{source}: expected a JSON object, got {type(hf).__name__}")
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size") if k not in hf]
        if missing:
            raise InputError(f"{source} lacks required field(s): {', '.join(missing)}")
        check_field_types(hf, source)
        heads = hf["num_attention_heads"]
        # rope theta sits at the top level in older configs and inside rope_parameters in newer ones.
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        theta = hf.get("rope_theta", rope.get("rope_theta", 10_000.0))
        eos = hf.get("eos_token_id")
        try:
            return cls(
                vocab_size=hf["vocab_size"],
                hidden_size=hf["hidden_size"],
                num_layers=hf["num_hidden_layers"],
                num_heads=heads,
                # absent or null means "the default"; a 0 given is refused by __post_init__, not replaced
                num_kv_heads=heads if hf.get("num_key_value_heads") is None else hf["num_key_value_heads"],
                head_dim=(hf["hidden_size"] // heads if heads else 0) if hf.get("head_dim") is None
                else hf["head_dim"],
                intermediate_size=hf["intermediate_size"],
                rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
                rope_theta=float(theta),
                tie_word_embeddings=hf.get("tie_word_embeddings", False),
                max_position_embeddings=hf.get("max_position_embeddings", 40_960),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_id=eos[0] if isinstance(eos, list) else eos,
            )
        except InputError as exc:         # __post_init__ says "config: ...": name the file instead
            raise InputError(f"{source}:{str(exc).removeprefix('config:')}") from None

    @classmethod
    def from_json(cls, path: str | Path, strict: bool = False) -> "ModelConfig":
        """Load a config.json file (or the config.json inside a checkpoint directory).

        strict=True also refuses what the engine does not implement (see `check_supported`): use it
        before running a model; the byte arithmetic of the published configs needs only the shape.
        """
        hf, source = read_config_json(path)
        if strict:
            check_field_types(hf, source)
            check_supported(hf, source)
        return cls.from_hf(hf, source)

    def to_hf(self) -> dict:
        """The config.json a Hugging Face Qwen3 checkpoint of this shape would carry."""
        d = asdict(self)
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": d["vocab_size"],
            "hidden_size": d["hidden_size"],
            "num_hidden_layers": d["num_layers"],
            "num_attention_heads": d["num_heads"],
            "num_key_value_heads": d["num_kv_heads"],
            "head_dim": d["head_dim"],
            "intermediate_size": d["intermediate_size"],
            "rms_norm_eps": d["rms_norm_eps"],
            "rope_theta": d["rope_theta"],
            "tie_word_embeddings": d["tie_word_embeddings"],
            "max_position_embeddings": d["max_position_embeddings"],
            "bos_token_id": d["bos_token_id"],
            "eos_token_id": d["eos_token_id"],
            "hidden_act": "silu",
            "attention_bias": False,
            "torch_dtype": "float32",
        }


def read_config_json(path: str | Path) -> tuple[dict, str]:
    """The parsed config.json (a path to it or to its directory) and its path, for messages."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise MissingFileError(f"no config.json at {path}")
    try:
        return json.loads(path.read_text()), str(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from None


def check_field_types(hf: dict, source: str) -> None:
    """Every numeric field the engine reads is a number (not a string, null or bool)."""
    for name in INT_FIELDS + FLOAT_FIELDS:
        if name not in hf or (hf[name] is None and name in ("num_key_value_heads", "head_dim")):
            continue            # optional; these two may be null and are then derived
        value = hf[name]
        wanted = int if name in INT_FIELDS else (int, float)
        if isinstance(value, bool) or not isinstance(value, wanted):
            kind = "an integer" if name in INT_FIELDS else "a number"
            raise InputError(f"{source}: field {name!r} must be {kind}, got {value!r}")


def check_supported(hf: dict, source: str = "config.json") -> None:
    """Refuse, naming the field and its value, what the engine does not implement.

    The engine runs full causal attention with plain RoPE, SwiGLU (silu) and bias-free projections.
    A config asking for anything else would load and silently give other logits than transformers.
    Qwen3 checkpoints in the wild carry rope_scaling: null and use_sliding_window: false, which pass.
    """
    def refuse(field: str, value, why: str):
        raise InputError(f"{source}: {field} = {json.dumps(value)} is not supported: {why}")

    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        refuse("hidden_act", act, "the engine's MLP is SwiGLU with silu")
    for field in ("rope_scaling", "rope_parameters"):
        rope = hf.get(field)
        if rope is None:
            continue
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
        if kind != "default":
            refuse(field, rope, "the engine implements plain RoPE only (rope_type 'default')")
    if hf.get("use_sliding_window"):
        refuse("use_sliding_window", hf["use_sliding_window"], "the engine attends to the whole history")
    sliding = [kind for kind in hf.get("layer_types") or [] if kind != "full_attention"]
    if sliding:
        refuse("layer_types", sliding[0], "the engine has full causal attention in every layer")
    for field in ("attention_bias", "mlp_bias"):
        if hf.get(field):
            refuse(field, hf[field], "the engine's projections have no bias")
    head_dim, heads, hidden = (hf.get(k) for k in ("head_dim", "num_attention_heads", "hidden_size"))
    if head_dim:
        if isinstance(head_dim, int) and head_dim % 2:
            refuse("head_dim", head_dim, ROPE_NEEDS_EVEN)
    elif isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and (hidden // heads) % 2:
        refuse("head_dim", hidden // heads, f"no head_dim is given, so it is hidden_size {hidden} // "
                                           f"num_attention_heads {heads}, and {ROPE_NEEDS_EVEN}")


def kv_bytes_per_token(config: ModelConfig, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token costs: K and V, in every layer, for every KV head."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes


CONFIGS = Path(__file__).parent / "configs"


def known_config(name_or_path: str | Path) -> ModelConfig:
    """A config.json by path, or a published model's shape by short name (e.g. llama-3-8b, qwen3-0.6b)."""
    path = Path(name_or_path)
    if not path.exists():
        path = CONFIGS / f"{str(name_or_path).lower().removesuffix('.json')}.json"
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in CONFIGS.glob("*.json")))
        raise MissingFileError(f"no config {str(name_or_path)!r}: give a path or one of {names}")
    return ModelConfig.from_json(path)
