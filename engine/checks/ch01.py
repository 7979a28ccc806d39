"""Chapter 1's checks: what one token of KV cache costs, the static cache's `update`, and the
memory a static cache reserves but never fills.

`kv_bytes_per_token` is compared with the formula on the shipped configs and on synthetic shapes
whose factors differ, so each classic mistake gives a different wrong number and can be named. The
static cache's `update` is driven directly with K/V values that encode (sequence, position), so a
value that lands in the wrong place says where it went; the decisive check plugs the class into the
engine and compares every logit with a from-scratch run.
"""

from __future__ import annotations

import random

import torch

from engine.checks import (ATOL, CheckFailed, Proved, ceil_div, check, compare_logits, expect_equal, fail, one_thread,
                           passed, review_choice, review_number, tiny)
from engine.config import ModelConfig, known_config
from engine.seeded import seeded_tokens

SHIPPED = ("llama-2-13b", "llama-3-8b", "llama-3-70b", "qwen3-0.6b")

# --------------------------------------------------------------------------------------------------
# Exercise 1.1: bytes of KV cache per token
# --------------------------------------------------------------------------------------------------


def _shape(layers: int, heads: int, kv_heads: int, head_dim: int) -> ModelConfig:
    """A made-up model shape; hidden_size differs from heads * head_dim on purpose."""
    return ModelConfig(vocab_size=1000, hidden_size=96, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=192)


# (name, config, dtype_bytes): the four shipped models in fp16, then shapes whose factors are all
# different (so halving, x heads/kv_heads, / layers and x wrong bytes give different numbers).
def _kv_cases() -> list[tuple[str, ModelConfig, int]]:
    cases = [(name, known_config(name), 2) for name in SHIPPED]
    shapes = [((5, 12, 3, 7), 1), ((3, 14, 2, 11), 4), ((7, 9, 9, 6), 2), ((1, 8, 1, 13), 4),
              ((6, 10, 5, 3), 8)]
    for number, ((layers, heads, kv, dim), nbytes) in enumerate(shapes, start=1):
        cases.append((f"synthetic #{number}", _shape(layers, heads, kv, dim), nbytes))
    return cases


def _kv_formula(c: ModelConfig, nbytes: int) -> int:
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * nbytes


# Classic mistakes: what each would return, and the hint that names it.
KV_BUGS = [
    (lambda c, b: c.num_layers * c.num_kv_heads * c.head_dim * b,
     "K and V counted once: every token stores a key AND a value vector, so multiply by 2"),
    (lambda c, b: 2 * c.num_layers * c.num_heads * c.head_dim * b,
     "num_heads (query heads) used instead of num_kv_heads: with grouped-query attention only the "
     "KV heads are cached, and several query heads read each one"),
    (lambda c, b: 2 * c.num_layers * c.hidden_size * b,
     "hidden_size used for the width of K/V: the cache holds num_kv_heads * head_dim values per "
     "layer, which differs from hidden_size under grouped-query attention"),
    (lambda c, b: 2 * c.num_kv_heads * c.head_dim * b,
     "the layers were left out: every layer keeps its own K and V, so multiply by num_layers"),
    (lambda c, b: 2 * c.num_layers * c.num_kv_heads * c.head_dim * b * 8,
     "wrong bytes per value: that counts bits (x 8); dtype_bytes is already in bytes"),
] + [
    (lambda c, b, fixed=fixed: 2 * c.num_layers * c.num_kv_heads * c.head_dim * fixed,
     f"wrong bytes per value: it always counts {fixed} byte(s) per value; use the dtype_bytes "
     f"argument (2 for fp16/bf16, 4 for fp32, 1 for int8)")
    for fixed in (1, 2, 4)
]


def _as_number(got):
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return None
    return got


@check
def check_kv_bytes_per_token(kv_bytes_per_token) -> None:
    """`kv_bytes_per_token(config, dtype_bytes)`: 2 x layers x KV heads x head_dim x bytes per value."""
    cases = _kv_cases()
    results = [(name, config, nbytes, kv_bytes_per_token(config, nbytes)) for name, config, nbytes in cases]
    for name, config, nbytes, got in results:
        want = _kv_formula(config, nbytes)
        value = _as_number(got)
        if value is None:
            fail(f"kv_bytes_per_token({name} config, dtype_bytes={nbytes})", f"the int {want}", repr(got),
                 "return a number of bytes (an int)")
        if value == want:
            if isinstance(value, int):
                continue
            fail(f"kv_bytes_per_token({name} config, dtype_bytes={nbytes})", f"the int {want}", repr(got),
                 "the right number, but not an int: keep to integer arithmetic (no `/`) or return "
                 "int(...)")
        # Which classic mistake reproduces every answer the function gave?
        matches = [hint for bug, hint in KV_BUGS
                   if all(_as_number(g) == bug(c, b) for _, c, b, g in results)]
        here = [hint for bug, hint in KV_BUGS if value == bug(config, nbytes)]
        hint = (matches or here or [
            "bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_dim x dtype_bytes"])[0]
        fail(f"kv_bytes_per_token({name} config, dtype_bytes={nbytes}); that config has "
             f"{config.num_layers} layers, {config.num_heads} query heads, {config.num_kv_heads} KV heads, "
             f"head_dim {config.head_dim}", want, got, hint)
    shipped = ", ".join(f"{name} {g:,}" for name, _, _, g in results[:len(SHIPPED)])
    passed(f"kv_bytes_per_token: {len(results)} configs; fp16 bytes per token: {shipped}")


# --------------------------------------------------------------------------------------------------
# Exercise 1.2: the static cache's update
# --------------------------------------------------------------------------------------------------

PAD = -7777.0          # the K/V values of padding tokens: they must never reach the cache


def _code(seq: int, pos: int, layer: int) -> float:
    """The K value (head 0, dim 0) the checks give token `pos` of `seq` in `layer`; exact in fp32."""
    return seq * 1000.0 + pos + 0.5 * layer


def _values(seq: int, pos: int, layer: int, heads: int, dim: int) -> torch.Tensor:
    """[heads, dim] K values of one token: its code plus a per-(head, dim) fraction."""
    frac = (torch.arange(heads)[:, None] * 0.25 + torch.arange(dim)[None, :] * 0.0625).float()
    return _code(seq, pos, layer) + frac


def _batch(seqs: list[int], starts: dict[int, int], counts: dict[int, int], layer: int, heads: int,
           dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k, v [B, H, T, D] and positions [B, T] of one ragged step; padding carries PAD."""
    width = max(counts[s] for s in seqs)
    k = torch.full((len(seqs), heads, width, dim), PAD)
    positions = torch.full((len(seqs), width), -1, dtype=torch.long)
    for b, s in enumerate(seqs):
        for t in range(counts[s]):
            pos = starts[s] + t
            positions[b, t] = pos
            k[b, :, t] = _values(s, pos, layer, heads, dim)
    v = torch.where(k == PAD, k, -k)          # V is the negated K, padding stays PAD
    return k, v, positions


# The scripted workload of the direct check: three live sequences (slots 3, 1, 2 after a freed one,
# batch order 12, 10, 11), three ragged steps; in the second, sequence 11's row is all padding (no new
# token), and sequence 12 ends exactly at the slot's capacity.
UPDATE_STEPS = [{12: 5, 10: 2, 11: 3}, {12: 1, 10: 3, 11: 0}, {12: 4, 10: 1, 11: 2}]
UPDATE_CAPACITY = 10
UPDATE_BATCH = [12, 10, 11]


def _update_config() -> ModelConfig:
    from engine.checkpoint import tiny_config
    return tiny_config(num_layers=2, num_heads=2, num_kv_heads=2, head_dim=4)


def _find(cache, layer: int, value: float) -> list[tuple[int, int]]:
    """Where (slot row, position) the K storage of `layer` holds `value` at head 0, dim 0."""
    storage = getattr(cache, "k", None)
    if not isinstance(storage, (list, tuple)) or layer >= len(storage):
        return []
    plane = storage[layer][:, 0, :, 0]
    return [tuple(int(i) for i in idx) for idx in (plane == value).nonzero()]


def _history_hint(cache, layer: int, b: int, seq: int, pos: int, got: float, start: int) -> str:
    """Name what went wrong with position `pos` of row b (sequence seq) in the returned keys."""
    if got == PAD:
        return (f"padding written: the keys at position {pos} are a padding token's; position -1 marks "
                "padding, which must never be written")
    if got == -_code(seq, pos, layer):
        return "the keys hold the values' numbers: return (keys, values, kv_lens) in that order"
    where = _find(cache, layer, _code(seq, pos, layer))
    own = cache.slot.get(seq) if isinstance(getattr(cache, "slot", None), dict) else None
    if not where:
        return (f"the key of sequence {seq}'s position {pos} is nowhere in self.k[{layer}]: write every "
                "new token's K and V into self.k[layer] and self.v[layer]")
    row, landed = where[0]
    if own is not None and row != own:
        return (f"sequence {seq}'s token went into slot row {row}, but the sequence owns slot row {own}: "
                f"batch row {b} is self.batch[{b}] = {seq}, whose slot is self.slot[{seq}] (a batch row "
                "is not a slot row)")
    if landed != pos:
        column = pos - start
        if landed == column:
            return (f"ragged rows written at the wrong offset: the token at column {column} of batch row "
                    f"{b} landed at position {landed}, its column, instead of its position {pos}; write "
                    "each token at positions[b, t]")
        return (f"ragged rows written at the wrong offset: sequence {seq}'s position {pos} landed at "
                f"position {landed}; each row of a ragged batch starts at its own position "
                f"(here {start}), so write each token at positions[b, t]")
    return (f"the slot holds the right key at position {pos}, but the returned keys do not: return the "
            "slots self.k[layer][self.slot[seq]] of the batch's sequences, in batch order, up to "
            "the longest new length")


def _span(lengths: dict[int, int], counts: dict[int, int]) -> str:
    """One step's new positions, in words ("sequence 12: positions 0..4, sequence 11: no new token")."""
    def new(s: int) -> str:
        first, last = lengths[s], lengths[s] + counts[s] - 1
        return "no new token" if counts[s] == 0 else f"position {first}" if counts[s] == 1 else \
            f"positions {first}..{last}"
    return ", ".join(f"sequence {s}: {new(s)}" for s in UPDATE_BATCH)


def _unpacked(out, what: str):
    """update's return value as (keys, values, kv_lens), or a failure saying what came back."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        fail(f"{what}: the return value", "a tuple (keys, values, kv_lens)", type(out).__name__)
    return out


def _expect_no_padding_stored(storage, layer: int, what: str) -> None:
    """No padding token's key anywhere in self.k[layer]."""
    if not bool((storage[layer] == PAD).any()):
        return
    row, pos = (storage[layer][:, 0, :, 0] == PAD).nonzero().tolist()[0]
    where = ("index -1 is the LAST position of a slot in Python" if pos == UPDATE_CAPACITY - 1
             else f"here it landed at position {pos}: it was moved to a real position instead of being skipped")
    fail(f"{what}: self.k[{layer}] holds a padding token's key at (slot row, position) ({row}, {pos})",
         hint=f"padding written: positions of -1 mark padding, which must never be written ({where})")


def _kv_lens_hint(got_lens, want_lens: list[int], lengths: dict[int, int], counts: dict[int, int]) -> str:
    """What a wrong kv_lens says about the bug."""
    if not isinstance(got_lens, list) or len(got_lens) != len(want_lens):
        return "kv_lens[b] is row b's length after this step: its highest position + 1"
    diff = {g - w for g, w in zip(got_lens, want_lens)}
    if diff == {-1}:
        return ("kv_lens is off by one (one short): a row whose highest position is p holds p + 1 keys, "
                "positions 0..p")
    if diff == {1}:
        return "kv_lens is off by one (one too many): a row whose highest position is p holds p + 1 keys, not p + 2"
    if all(g == lengths[s] for g, s in zip(got_lens, UPDATE_BATCH)):
        return "kv_lens must already count this step's new tokens"
    if any(counts[s] == 0 and g != lengths[s] for g, s in zip(got_lens, UPDATE_BATCH)):
        idle = [s for s in UPDATE_BATCH if counts[s] == 0]
        return (f"sequence {idle[0]}'s row is all padding (no new token), and its kv_len must stay "
                f"{lengths[idle[0]]}: a row's length is never less than before, max(old length, highest "
                "position + 1)")
    return "kv_lens[b] is row b's length after this step: its highest position + 1"


def _expect_kv_lens(kv_lens, want_lens: list[int], lengths, counts, what: str) -> None:
    got_lens = kv_lens.tolist() if isinstance(kv_lens, torch.Tensor) else kv_lens
    if got_lens != want_lens:
        fail(f"{what}: kv_lens", want_lens, got_lens, _kv_lens_hint(got_lens, want_lens, lengths, counts))
    if not isinstance(kv_lens, torch.Tensor) or kv_lens.dtype != torch.long:
        fail(f"{what}: the type of kv_lens", "a torch.long tensor",
             f"a {kv_lens.dtype} tensor" if isinstance(kv_lens, torch.Tensor) else type(kv_lens).__name__,
             "return kv_lens as a torch.long tensor of shape [B], e.g. torch.tensor(lengths) of a list of Python ints")


def _expect_shape(name: str, tensor, want_shape: list[int], what: str, at_least: bool) -> None:
    """[B, Hkv, max(kv_lens), D]; with `at_least`, any length from max(kv_lens) on (checked before the
    contents, so a long one is named by its contents first)."""
    shape = list(tensor.shape) if isinstance(tensor, torch.Tensor) else None
    fits = shape is not None and len(shape) == 4 and shape[:2] + shape[3:] == want_shape[:2] + want_shape[3:]
    if fits and (shape[2] >= want_shape[2] if at_least else shape[2] == want_shape[2]):
        return
    longer = fits and shape[2] > want_shape[2]
    fail(f"{what}: the shape of the returned {name}", want_shape, shape if shape is not None else type(tensor).__name__,
         f"cut the slots to the longest new length, max(kv_lens) = {want_shape[2]} positions: "
         "self.k[layer][rows, :, :span]" if longer else
         "[B, Hkv, max(kv_lens), D]: the batch's slot rows, in batch order")


def _expect_stored(cache, storage, layer: int, lengths, after, what: str, heads: int, dim: int) -> None:
    """Each new token's K at its sequence's slot row and position in self.k[layer]."""
    for b, s in enumerate(UPDATE_BATCH):
        for pos in range(lengths[s], after[s]):
            stored = storage[layer][cache.slot[s], :, pos]
            if not torch.equal(stored.float(), _values(s, pos, layer, heads, dim)):
                got = float(stored[0, 0])
                fail(f"{what}: self.k[{layer}] at sequence {s}'s slot row {cache.slot[s]}, position {pos}",
                     f"{_code(s, pos, layer):g} (head 0, dim 0)", f"{got:g}",
                     _history_hint(cache, layer, b, s, pos, got, lengths[s]))


def _expect_returned(cache, keys, values, layer: int, lengths, after, what: str, heads: int, dim: int) -> None:
    """Row b of the returned keys and values: its sequence's whole history, new tokens first checked."""
    for b, s in enumerate(UPDATE_BATCH):
        for pos in list(range(lengths[s], after[s])) + list(range(lengths[s])):
            want = _values(s, pos, layer, heads, dim)
            if not torch.equal(keys[b, :, pos].float(), want):
                got = float(keys[b, 0, pos, 0])
                fail(f"{what}: the returned keys of row {b} (sequence {s}) at position {pos}",
                     f"{_code(s, pos, layer):g} (head 0, dim 0)", f"{got:g}",
                     _history_hint(cache, layer, b, s, pos, got, lengths[s]))
            if not torch.equal(values[b, :, pos].float(), -want):
                got = float(values[b, 0, pos, 0])
                fail(f"{what}: the returned values of row {b} (sequence {s}) at position {pos} (the keys there "
                     "are right)", f"{-_code(s, pos, layer):g} (head 0, dim 0)", f"{got:g}",
                     "the values are the keys: store v, not k, in self.v[layer]" if got == _code(s, pos, layer)
                     else "store each token's V in self.v[layer] where its K goes in self.k[layer], and return "
                     "self.v[layer]'s slots as the values")


def _expect_committed(cache, layer: int, layers: int, lengths, after, what: str) -> None:
    """length(seq) after update(layer): the new lengths after the last layer's call, the old ones before."""
    committed = {s: cache.length(s) for s in UPDATE_BATCH}
    expected = after if layer == layers - 1 else lengths
    if committed == expected:
        return
    if layer < layers - 1 and committed == after:
        hint = (f"length committed on every layer (or on one before the last): update(layer={layer}) is not the "
                f"last layer's call (that is layer {layers - 1}); only the last layer commits the new lengths, so "
                "every layer of one forward sees the same old lengths")
    elif layer == layers - 1 and committed == lengths:
        hint = "the last layer's call must commit each row's new length into self.lengths"
    else:
        hint = "the committed length of a sequence is its highest position + 1"
    fail(f"{what}: length(seq) after the call, for sequences {UPDATE_BATCH}",
         [expected[s] for s in UPDATE_BATCH], [committed[s] for s in UPDATE_BATCH], hint)


def _update_layer(cache, config: ModelConfig, layer: int, lengths, counts, after, what: str, proved: Proved) -> None:
    """One update(layer) call of a step, checked: storage, kv_lens, returned history, commit."""
    heads, dim = config.num_kv_heads, config.head_dim
    k, v, positions = _batch(UPDATE_BATCH, lengths, counts, layer, heads, dim)
    keys, values, kv_lens = _unpacked(cache.update(layer, k.clone(), v.clone(), positions.clone()), what)
    storage = getattr(cache, "k", None)
    inspectable = isinstance(storage, (list, tuple)) and layer < len(storage)
    if inspectable:
        _expect_no_padding_stored(storage, layer, what)
    want_lens = [after[s] for s in UPDATE_BATCH]
    _expect_kv_lens(kv_lens, want_lens, lengths, counts, what)
    want_shape = [len(UPDATE_BATCH), heads, max(want_lens), dim]
    for name, tensor in (("keys", keys), ("values", values)):
        _expect_shape(name, tensor, want_shape, what, at_least=True)
    if inspectable:
        _expect_stored(cache, storage, layer, lengths, after, what, heads, dim)
        proved.note("padding never written, each new token at its slot row and position")
    _expect_returned(cache, keys, values, layer, lengths, after, what, heads, dim)
    for name, tensor in (("keys", keys), ("values", values)):
        _expect_shape(name, tensor, want_shape, what, at_least=False)
    _expect_committed(cache, layer, config.num_layers, lengths, after, what)


def _drive_update(cls) -> Proved:
    """The scripted workload through cls's update, checking each call; raises CheckFailed, else returns
    what it proved."""
    config = _update_config()
    cache = cls(config, max_seqs=4, capacity=UPDATE_CAPACITY, dtype=torch.float32)
    for seq in (7, 10, 11, 12):
        cache.create(seq)
    cache.free(7)                             # so slot rows and batch rows differ
    proved = Proved("StaticKVCache.update")
    lengths = {s: 0 for s in UPDATE_BATCH}
    for number, counts in enumerate(UPDATE_STEPS, start=1):
        for s in UPDATE_BATCH:
            cache.reserve(s, counts[s])
        cache.set_batch(UPDATE_BATCH)
        after = {s: lengths[s] + counts[s] for s in UPDATE_BATCH}
        for layer in range(config.num_layers):
            what = (f"step {number} ({_span(lengths, counts)}; padding elsewhere), update(layer={layer}) of "
                    f"{config.num_layers}")
            _update_layer(cache, config, layer, lengths, counts, after, what, proved)
        lengths = after
    _note_the_workload(proved, cache, lengths, config.num_layers)
    return proved


def _note_the_workload(proved: Proved, cache, lengths: dict[int, int], layers: int) -> None:
    """What the scripted workload that passed covered, read off the script and the cache."""
    slots = getattr(cache, "slot", None)
    if isinstance(slots, dict) and any(slots.get(s) != b for b, s in enumerate(UPDATE_BATCH)):
        proved.note("sequences in slot rows that differ from their batch rows")
    if any(0 in step.values() for step in UPDATE_STEPS):
        proved.note("one row all padding in a step")
    if UPDATE_CAPACITY in lengths.values():
        proved.note(f"one sequence filling its {UPDATE_CAPACITY}-slot row exactly")
    proved.note(f"each row's history and kv_lens right after every one of {layers} layers, lengths committed "
                "on the last layer only")


def _update_hint(cls) -> str | None:
    """The direct check's hint for cls, or None when the direct check finds nothing wrong."""
    try:
        _drive_update(cls)
    except CheckFailed as exc:
        message = str(exc)
        found = message.split(". Hint: ", 1)[1] if ". Hint: " in message else message
        return (f"check_static_update, which calls update directly on sequences {UPDATE_BATCH}, "
                f"finds: {found}")
    except Exception:      # noqa: BLE001 -- the decisive check reports its own failure
        return None
    return None


@check
def check_static_update(cls) -> None:
    """The static cache's update, called directly: where each token lands, what comes back, when
    lengths are committed."""
    _drive_update(cls).passed(f"{len(UPDATE_STEPS)} ragged steps")



@check
def check_static_cache_in_engine(cls, bs: int = 4, decode_steps: int = 20, seed: int = 0) -> None:
    """The decisive check: the class inside the engine; every logit equals a from-scratch run.

    Ragged prefill of lengths bs-1, bs, bs+1, 2bs+1, then `decode_steps` decode steps; halfway one
    sequence is freed and a newcomer is prefilled into its (stale) slot while the others decode. The
    longest sequence ends exactly at the slot's capacity. Every step's logits are kept; since
    position i of a from-scratch run sees only tokens 0..i, one from-scratch run of each whole
    sequence at the end gives the expected logits of every step.
    """
    from engine.generate import cached_step, scratch_logits

    model = tiny()
    lengths = [bs - 1, bs, bs + 1, 2 * bs + 1]
    capacity = 2 * bs + 1 + decode_steps
    cache = cls(model.config, max_seqs=len(lengths), capacity=capacity, dtype=torch.float32)
    prompts = {s: seeded_tokens(n, seed=300 + seed + s) for s, n in enumerate(lengths)}
    seqs: dict[int, list[int]] = {s: [] for s in prompts}     # the tokens each sequence has so far
    for s in seqs:
        cache.create(s)
    rng = random.Random(seed)
    steps: list[tuple[str, int, torch.Tensor, int]] = []      # (stage, seq, logits, first position)

    def step(new: dict[int, list[int]], stage: str) -> None:
        active = sorted(new)
        got = cached_step(model, cache, active, [new[s] for s in active])
        for s, logits in zip(active, got):
            steps.append((stage, s, logits, len(seqs[s])))
            seqs[s] = seqs[s] + new[s]

    crash = None
    with one_thread():
        try:
            step(prompts, f"after prefilling a ragged batch of lengths {lengths}")
            newcomer = len(lengths)
            for t in range(decode_steps):
                new = {s: [rng.randrange(256)] for s in seqs if s != 1 or t < decode_steps // 2}
                stage = f"at decode step {t + 1}"
                if t == decode_steps // 2:
                    cache.free(1)             # its slot, full of stale K/V, goes to a newcomer
                    cache.create(newcomer)
                    seqs[newcomer] = []
                    new[newcomer] = seeded_tokens(bs + 2, seed=400 + seed)
                    stage += " (a newcomer prefills into a freed slot)"
                step(new, stage)
        except NotImplementedError:
            raise
        except Exception as exc:              # noqa: BLE001 -- wrong logits before it explain more
            crash = exc
        order = [s for s in sorted(seqs) if seqs[s]]
        want = dict(zip(order, scratch_logits(model, [seqs[s] for s in order])))
    for stage, s, logits, first in steps:
        try:
            compare_logits(logits, want[s][first:first + len(logits)],
                           f"with your StaticKVCache in the engine, {stage}, sequence {s} "
                           f"({first + len(logits)} tokens)", first_position=first)
        except CheckFailed as exc:
            hint = _update_hint(cls) or (
                "the cached run reads a different history than the model computed: check that update "
                "writes every new K/V at its position and returns each row's whole history with the "
                "right kv_lens")
            raise CheckFailed(f"{exc}. Hint: {hint}") from None
    if crash is not None:
        raise crash
    expect_equal(cache.length(3), capacity, f"after {decode_steps} decode steps: length(3)",
                 "the longest sequence should fill its slot exactly")
    passed(f"your StaticKVCache in the engine: prefill of lengths {lengths}, {decode_steps} decode steps, "
           f"a newcomer in a freed slot, one sequence filling its {capacity}-token slot; every logit "
           f"matches a from-scratch run within {ATOL:g}")


# --------------------------------------------------------------------------------------------------
# Exercise 1.3: the fragmentation tax
# --------------------------------------------------------------------------------------------------

def _util_cases() -> list[tuple[list[int], int]]:
    from engine.seeded import request_lengths
    return [([20, 500, 137], 1024), ([1024], 1024), ([1, 1023], 1024), ([100] * 32, 512),
            ([3, 9, 4, 7, 5], 16), (request_lengths(32, 20, 500, seed=0), 1024)]


@check
def check_static_utilization(static_utilization) -> None:
    """`static_utilization(lengths, capacity)`: tokens stored / positions reserved, one slot each."""
    for lengths, capacity in _util_cases():
        tokens, reserved = sum(lengths), len(lengths) * capacity
        want = tokens / reserved
        got = static_utilization(list(lengths), capacity)
        value = _as_number(got)
        if value is not None and abs(value - want) <= 1e-9:
            continue
        shown = lengths if len(lengths) <= 6 else f"the chapter's {len(lengths)}-request workload"
        hint = "every request reserves one whole slot of `capacity` positions, whatever it stores"
        if value is not None:
            if abs(value - 100 * want) <= 1e-6:
                hint = "that is a percentage; return a fraction between 0 and 1"
            elif abs(value - (1 - want)) <= 1e-9:
                hint = "that is the unused share (the waste); return the share that holds tokens"
            elif abs(value - tokens / (len(lengths) * max(lengths))) <= 1e-9:
                hint = ("it divides by the longest request, not by the slot: a static cache reserves "
                        "`capacity` positions for every request")
            elif abs(value - tokens / capacity) <= 1e-9:
                hint = "it reserves one slot in total; each of the requests reserves its own slot"
        fail(f"static_utilization({shown}, capacity={capacity})", f"{tokens}/{reserved} = {want:.4f}",
             got, hint)
    chapter, slot = _util_cases()[-1]
    passed(f"static_utilization: {len(_util_cases())} workloads; the chapter's {len(chapter)} requests of "
           f"{min(chapter)}-{max(chapter)} tokens in {slot:,}-token slots use "
           f"{static_utilization(list(chapter), slot):.1%} of what they reserve")


def _fit_cases() -> list[tuple[int, int, int, int]]:
    """(gpu_bytes, weight_bytes, slot_tokens, bytes_per_token), including an exact fit and no room."""
    return [(40 * 10**9, 26_031_308_800, 1024, 819_200), (80 * 10**9, 16_060_522_496, 4096, 131_072),
            (1000, 200, 10, 8), (1000, 200, 10, 7), (1000, 1200, 10, 8), (24 * 2**30, 0, 2048, 114_688),
            (1000, 999, 1, 2)]


@check
def check_slots_that_fit(slots_that_fit) -> None:
    """`slots_that_fit(gpu_bytes, weight_bytes, slot_tokens, bytes_per_token)`: whole slots that fit in
    the memory the weights leave free, 0 when there is none."""
    for gpu, weights, slot_tokens, per_token in _fit_cases():
        free, slot = gpu - weights, slot_tokens * per_token
        want = max(free, 0) // slot
        got = slots_that_fit(gpu, weights, slot_tokens, per_token)
        value = _as_number(got)
        if value == want and isinstance(value, int):
            continue
        what = (f"slots_that_fit(gpu_bytes={gpu:,}, weight_bytes={weights:,}, slot_tokens={slot_tokens}, "
                f"bytes_per_token={per_token:,})")
        hint = "(gpu_bytes - weight_bytes) // (slot_tokens * bytes_per_token), and 0 if that is negative"
        if value == want:
            hint = "return a whole number of slots as an int (use //, not /)"
        elif value is not None:
            if free < 0 and value < 0:
                hint = "the weights do not even fit: no slot fits, return 0, not a negative count"
            elif value == ceil_div(free, slot) or value == round(free / slot):
                hint = ("rounded up: a slot that only partly fits cannot be reserved; round down "
                        "(floor division)")
            elif value == gpu // slot:
                hint = "the weights were not subtracted: they occupy the GPU before any KV cache"
            elif value == max(free, 0) // per_token:
                hint = "that counts tokens, not slots: each slot costs slot_tokens * bytes_per_token"
            elif abs(value - free / slot) < 1e-9:
                hint = "a fraction of a slot cannot be reserved: round down to whole slots (//)"
        fail(what, want, got, hint)
    cases = _fit_cases()
    exact = sum((gpu - weights) % (tokens * per) == 0 and gpu > weights for gpu, weights, tokens, per in cases)
    over = sum(weights > gpu for gpu, weights, *_ in cases)
    passed(f"slots_that_fit: {len(cases)} cases, {exact} an exact fit and {over} with weights larger than the GPU")


# --------------------------------------------------------------------------------------------------
# Auto-graded review questions
# --------------------------------------------------------------------------------------------------

@check
def check_review_recompute(answer) -> None:
    """Token positions a from-scratch loop runs through the model: 50 new tokens after 100."""
    prompt, new = 100, 50
    want = sum(prompt + i for i in range(new))
    off_by_one = ("one step off: the first token comes from the prompt alone (100 positions), the 50th "
                  "from the prompt and 49 generated tokens")
    review_number(answer, "R1", "r1_answer", want,
                  f"{want:,} token positions from scratch, against {prompt + new - 1} with a cache",
                  "is not the number of token positions",
                  "step i (i = 0, 1, ..., 49) runs the model over the prompt and the i tokens generated so "
                  "far; add those up",
                  hints={prompt + new - 1: "that is the count WITH a cache (the prompt once, then one position "
                                           "per step)",
                         sum(prompt + i for i in range(new + 1)): off_by_one,
                         sum(prompt + i for i in range(1, new + 1)): off_by_one})


@check
def check_review_kv_heads(answer) -> None:
    """Which change halves the KV bytes per token (choice b: halve num_key_value_heads)."""
    review_choice(answer, "R2", "r2_answer", "b", "halving the KV heads halves every layer's K and V",
                  "does not halve the bytes per token",
                  {"a": "query heads are not cached: the keys and values of the KV heads are",
                   "c": "the vocabulary sizes the embedding and the output layer, not the cache",
                   "d": "the longest allowed context caps how many tokens a sequence may hold, not what one "
                        "token costs"})
