"""Qwen3, small and readable: RMSNorm, RoPE, grouped-query attention with q/k norm, SwiGLU.

Module names follow the Hugging Face checkpoint keys, so a state dict loads without renaming.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from engine.attention.sdpa import as_dtype, as_float, attention   # fused; attention.reference: the ground truth
from engine.config import ROPE_NEEDS_EVEN, ModelConfig
from engine.errors import InputError


class Direct(nn.Module):
    """An nn.Module called straight to its forward: a decode step makes ~40 module calls, and nn.Module's
    call (hook dispatch) costs about as much as a small op. Forward hooks are not run (nothing in the
    engine registers any)."""

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class Linear(nn.Linear):
    """nn.Linear without a bias, called straight (see Direct): the weight keeps its checkpoint name."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


class RMSNorm(Direct):
    """Scale each vector to unit root-mean-square, then by a learned weight (computed in float32)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return as_dtype(rms_normalize(x, self.eps), x.dtype).mul_(self.weight)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, in float32: transformers' Qwen3RMSNorm step for
    step (x * x is its pow(x, 2) exactly, in a cheaper op). torch.rms_norm runs the same ops, but its
    wrapper costs more than they do at a few rows."""
    wide = as_float(x)
    if not wide.is_cpu:                # one fused kernel (a GPU's mean multiplies by 1 / width: its own numbers)
        return wide * (wide * wide).mean(-1, keepdim=True).add_(eps).rsqrt_()
    # A CPU's mean is this sum, then div_ by the width; given as tensors, the width and eps cost no conversion
    width, epsilon = norm_constants(x.shape[-1], eps, x.device)
    return wide * (wide * wide).sum(-1, keepdim=True).div_(width).add_(epsilon).rsqrt_()   # in place, same numbers


@functools.lru_cache(maxsize=16)
def norm_constants(width: int, eps: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_normalize's width and eps as float32 scalar tensors, made once: the numbers its ops would make of a
    Python width and eps on every call."""
    with torch.inference_mode(False):       # normal tensors, usable in and out of inference mode
        return (torch.tensor(float(width), dtype=torch.float32, device=device),
                torch.tensor(eps, dtype=torch.float32, device=device))


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, 1, T, D] of the rotary angles at positions [B, T]: dimension i and i + D/2 turn by
    the same angle, and the sin's first half is negated (see apply_rope); every layer shares them."""
    batch, tokens = positions.shape
    frequencies, signs = rope_frequencies(head_dim, theta, positions.device)
    angles = positions.clamp(min=0).view(batch, 1, tokens, 1) * frequencies     # [B, 1, T, D] float32
    return angles.cos(), angles.sin() * signs


@functools.lru_cache(maxsize=16)
def rope_frequencies(head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """theta^(-2i/D) for i < D/2, written twice (whole width), and the sin's signs, -1 then +1: the same
    every forward, so made once."""
    half = head_dim // 2
    with torch.inference_mode(False):       # normal tensors, usable in and out of inference mode
        inv_freq = 1.0 / theta ** (torch.arange(0, half, device=device, dtype=torch.float32) / half)
        signs = torch.cat([torch.full((half,), -1.0, device=device), torch.ones(half, device=device)])
        return torch.cat([inv_freq, inv_freq]), signs


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D] by the angles of rope_angles (the half-split convention): the pair (x1, x2)
    becomes (x1 cos - x2 sin, x2 cos + x1 sin). Whole-width that is x cos + (x2, x1) (-sin, sin): the
    halves swapped by one roll, times the sin whose first half rope_angles negated (bit-identical to
    transformers' x cos + rotate_half(x) sin, in fewer ops)."""
    wide = as_float(x)
    return as_dtype((wide * cos).add_(wide.roll(x.shape[-1] // 2, dims=-1).mul_(sin)), x.dtype)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              joint: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_rope on q and k, separately or (`joint`) as one tensor: the same numbers. The model's
    attention rotates them jointly, as the heads of one projection (Attention.forward)."""
    if not joint:
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    qk = apply_rope(torch.cat([q, k], dim=1), cos, sin)
    return qk[:, :q.shape[1]], qk[:, q.shape[1]:]


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of x [B, H, T, D] at positions [B, T] (the half-split convention)."""
    return apply_rope(x, *rope_angles(positions, x.shape[-1], theta))


def derived(owner: nn.Module, name: str, make, *sources: torch.Tensor) -> torch.Tensor:
    """make(*sources), kept on `owner` until a source changes (written in place, replaced, moved or cast).

    For tensors made from the checkpoint's weights (a fused projection), so the checkpoint keeps
    Hugging Face's layout and a changed weight (a test, a check) is never read stale.
    """
    key = [(id(t), version(t), t.data_ptr()) for t in sources]
    kept = owner.__dict__.get(name)
    if kept is not None and kept[0] == key:
        return kept[2]
    with torch.inference_mode(False), torch.no_grad():   # a normal tensor, usable in and out of inference mode
        made = make(*sources)
    owner.__dict__[name] = (key, sources, made)          # the sources held, so no other tensor takes their ids
    return made


def version(t: torch.Tensor) -> int | None:
    """How many times t was written in place (None for an inference tensor, which keeps no count)."""
    try:
        return t._version
    except RuntimeError:
        return None


class Attention(Direct):
    """Grouped-query self-attention; new K/V go through the cache when there is one."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.q_proj = Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim)
        self.k_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim)
        self.v_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)    # Qwen3: per-head norm of q and k
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None, rope=None) -> torch.Tensor:
        """rope: (cos, sin) from rope_angles, computed once per forward; None computes them here.

        The heads are cut apart with split_with_sizes: Tensor.split is a Python wrapper around it that, in
        inference mode, took three times as long (15 us against 5 us a call on a 2-core CPU), twice a layer."""
        cfg = self.cfg
        qk, v = self.project_qkv(x).split_with_sizes([cfg.num_heads + cfg.num_kv_heads, cfg.num_kv_heads], dim=2)
        cos, sin = rope if rope is not None else rope_angles(positions, cfg.head_dim, cfg.rope_theta)
        qk = apply_rope(self.norm_qk(qk).transpose(1, 2), cos, sin)     # q and k heads, normed and rotated
        (q, k), v = qk.split_with_sizes([cfg.num_heads, cfg.num_kv_heads], dim=1), v.transpose(1, 2)
        if cache is None:                      # from scratch: the batch is the whole history
            out = attention(q, k, v, positions, (positions >= 0).sum(-1))
        elif hasattr(cache, "attend"):         # the cache brings its own attention (e.g. a paged kernel)
            out = cache.attend(self.layer, q, k, v, positions)
        else:                                  # protocol path: store, read the history back, attend
            keys, values, kv_lens = cache.update(self.layer, k, v, positions)
            out = attention(q, keys, values, positions, kv_lens)
        return self.o_proj(out.transpose(1, 2).flatten(2))

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """q, k and v heads side by side, [B, T, Hq + 2 Hkv, D]: one matrix product with the three
        weights stacked (made once, remade if a weight changes), not three."""
        weight = derived(self, "_qkv_weight", lambda *w: torch.cat(w), self.q_proj.weight, self.k_proj.weight,
                         self.v_proj.weight)
        return nn.functional.linear(x, weight).unflatten(-1, (-1, self.cfg.head_dim))

    def norm_qk(self, qk: torch.Tensor) -> torch.Tensor:
        """Qwen3's per-head RMSNorm of the q heads (q_norm's weight) and the k heads (k_norm's) of
        qk [..., Hq + Hkv, D], as one norm and one multiply by their weights stacked head by head
        (the same numbers as q_norm(q), k_norm(k))."""
        cfg = self.cfg
        weight = derived(self, "_qk_norm_weight", lambda wq, wk: torch.cat(
            [wq.expand(cfg.num_heads, -1), wk.expand(cfg.num_kv_heads, -1)]), self.q_norm.weight, self.k_norm.weight)
        return as_dtype(rms_normalize(qk, self.q_norm.eps), qk.dtype).mul_(weight)


class MLP(Direct):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), silu and product in place on gate's fresh output
    (a prompt's [T, 3 hidden] tensors are megabytes, and fresh memory costs page faults)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.project_gate_up(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate, inplace=True).mul_(up))

    def project_gate_up(self, x: torch.Tensor) -> torch.Tensor:
        """gate(x) and up(x) side by side, [..., 2 intermediate]: one matrix product with the two weights
        stacked (made once, remade if a weight changes), not two. A decode step's products are small, and
        on a CPU each is a parallel region whose threads must all wake: on a busy machine that costs more
        than the product."""
        weight = derived(self, "_gate_up_weight", lambda *w: torch.cat(w), self.gate_proj.weight, self.up_proj.weight)
        return nn.functional.linear(x, weight)


class DecoderLayer(Direct):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)); each sum is written into the
    branch's own fresh output (in place: no new tensor, the same numbers)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None, rope=None) -> torch.Tensor:
        x = self.self_attn(self.input_layernorm(x), positions, cache, rope).add_(x)
        return self.mlp(self.post_attention_layernorm(x)).add_(x)


class Qwen3Model(nn.Module):
    """The whole model: token ids and positions in, next-token logits out."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.head_dim % 2:
            raise InputError(f"config: head_dim {cfg.head_dim} is odd: {ROPE_NEEDS_EVEN}")
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, cache=None,
                only: torch.Tensor | None = None) -> torch.Tensor:
        """token_ids, positions [B, T] (position -1 = padding) -> logits [B, T, vocab] in float32.

        Without a cache every row must be a whole sequence: positions 0, 1, 2, ... then padding.
        `only` [B] (a column per row) asks for just those logits, [B, vocab]: a server samples from
        each row's last token, and the vocabulary projection of the others is wasted work.
        """
        if token_ids.shape != positions.shape or token_ids.dim() != 2:
            raise ValueError(f"token_ids {tuple(token_ids.shape)} and positions {tuple(positions.shape)} "
                             "must both be [batch, tokens]")
        ids = token_ids.clamp(0, self.config.vocab_size - 1)   # padding may hold any id
        if bool((ids != token_ids).any()):                      # one out of range: an error if it is a real token's
            check_token_ids(token_ids, positions, self.config.vocab_size)
        if cache is None:
            check_from_scratch_positions(positions)
        x = self.embed_tokens(ids)
        rope = rope_angles(positions, self.config.head_dim, self.config.rope_theta)
        for layer in self.layers:
            x = layer(x, positions, cache, rope)
        if only is not None:                   # a decode batch (one column) needs no index
            x = x[:, 0] if x.shape[1] == 1 else x[torch.arange(x.shape[0], device=x.device), only]
        return as_float(self.lm_head(self.norm(x)))


def check_token_ids(token_ids: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> None:
    """Every real token (position >= 0) is an id in [0, vocab); padding (position -1) may hold anything.

    Checked before any layer runs, so a bad id changes no cache.
    """
    bad = ((token_ids < 0) | (token_ids >= vocab_size)) & (positions >= 0)
    if bool(bad.any()):
        row, column = (int(i) for i in bad.nonzero()[0])
        raise InputError(f"token id {int(token_ids[row, column])} in row {row} at position "
                         f"{int(positions[row, column])} is outside the vocabulary [0, {vocab_size})")


def check_prompt_ids(prompt, vocab_size: int, what: str) -> None:
    """A prompt (a list of ints) holds only ids in [0, vocab); the error names `what` and the position."""
    for position, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise InputError(f"{what}: token {token!r} at position {position} is not an id in "
                             f"[0, {vocab_size})")


def check_from_scratch_positions(positions: torch.Tensor) -> None:
    """Without a cache, key index = position, so each row must read 0, 1, 2, ... then -1 padding."""
    expected = torch.arange(positions.shape[1], device=positions.device).expand_as(positions)
    whole = torch.where(expected < (positions >= 0).sum(-1, keepdim=True), expected, -1)
    wrong = (positions != whole).any(dim=1)
    if bool(wrong.any()):
        row = int(wrong.nonzero()[0])
        raise ValueError(f"without a cache each row must hold a whole sequence, positions 0..n-1 then -1 "
                         f"padding; row {row} has positions {positions[row].tolist()}")
