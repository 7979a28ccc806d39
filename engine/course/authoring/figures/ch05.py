"""Chapter 5's figures: the prefix tree of a cache as requests arrive and finish, and what sharing a
system prompt saves as requests pile up. The numbers come from a PrefixCache (the engine's, or the
learner's) over a real PagedKVCache; only the bookkeeping runs (no model), so every view is instant.
"""
from __future__ import annotations

import textwrap

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.cache.slots import blocks_needed
from engine.checkpoint import tiny_config

BS = 4


def _bookkeeping_cache(num_blocks: int, block_size: int) -> PagedKVCache:
    config = tiny_config(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2)
    return PagedKVCache(config, num_blocks, block_size=block_size)


def prefill(prefix: PrefixCache, seq: int, prompt: list[int]) -> int:
    """attach, then 'prefill' the rest (reserve it and record its length, as a forward pass would),
    then remember; returns the tokens prefilled."""
    reused = prefix.attach(seq, prompt)
    cache = prefix.cache
    cache.reserve(seq, len(prompt) - reused)
    cache.set_length(seq, len(prompt))
    prefix.remember(seq, prompt)
    return len(prompt) - reused


# ---- the walk the explorer shows ---------------------------------------------------------------------

# Block texts by name: a two-block system prompt, then one block of each request's own text.
TEXTS = {"sys-1": [1, 2, 3, 4], "sys-2": [5, 6, 7, 8], "a": [11, 12, 13, 14], "b": [21, 22, 23, 24],
         "t": [31, 32, 33, 34]}
PROMPTS = {"R0": ["sys-1", "sys-2", "a"], "R1": ["sys-1", "sys-2", "b"], "R2": ["t"],
           "R3": ["sys-1", "sys-2", "a"]}
TAIL = [99, 98]                      # two tokens of a partial block that every prompt ends with
EVENTS = [("start", None), ("arrive", "R0"), ("arrive", "R1"), ("finish", "R0"), ("arrive", "R2"),
          ("finish", "R1"), ("arrive", "R3"), ("finish", "R2"), ("evict", 1), ("finish", "R3"),
          ("evict", 2), ("evict", 2)]


@dataclass
class Snapshot:
    """What one step of the walk looks like: the event, the tree, the line, the sequences."""

    event: str
    nodes: dict[int, dict] = field(default_factory=dict)     # key -> name, block, parent, owners, place
    line: list[str] = field(default_factory=list)           # evictable entries, next victim first
    live: dict[str, list[str]] = field(default_factory=dict)
    free_blocks: int = 0


def _prompt(names: list[str]) -> list[int]:
    return [t for name in names for t in TEXTS[name]] + TAIL


def _name(tokens: tuple) -> str:
    return next((name for name, text in TEXTS.items() if tuple(text) == tuple(tokens)), "?")


def prefix_tree_walk(prefix_class=PrefixCache, num_blocks: int = 14) -> list[Snapshot]:
    """Run EVENTS through a prefix cache of `prefix_class` and snapshot it after each one."""
    prefix = prefix_class(_bookkeeping_cache(num_blocks, BS))
    cache, seqs, snapshots = prefix.cache, {}, []
    for kind, arg in EVENTS:
        if kind == "arrive":
            seqs[arg] = len(seqs)
            reused = len(_prompt(PROMPTS[arg])) - prefill(prefix, seqs[arg], _prompt(PROMPTS[arg]))
            what = f"{arg} arrives ({' + '.join(PROMPTS[arg])} + 2 tokens): {reused} tokens from the cache"
        elif kind == "finish":
            cache.free(seqs[arg])
            what = f"{arg} finishes: its sequence lets go of its blocks"
        elif kind == "evict":
            before = {key: _name(entry.tokens) for key, entry in prefix.entries.items()}
            freed = prefix.evict(cache.allocator.num_free + arg)
            taken = [name for key, name in before.items() if key not in prefix.entries]
            what = (f"the pool runs low: evict({arg} more free block{'s' if arg > 1 else ''}) takes {freed}"
                    + (f" ({', '.join(taken)})" if taken else ""))
        else:
            what = "an empty cache"
        snap = Snapshot(what, free_blocks=cache.allocator.num_free)
        line = list(prefix.lru)
        for key, entry in prefix.entries.items():
            snap.nodes[key] = {"name": _name(entry.tokens), "block": entry.block, "parent": entry.parent,
                               "owners": cache.allocator.refcount(entry.block) - 1,
                               "place": line.index(key) + 1 if key in line else None}
        snap.line = [_name(prefix.entries[k].tokens) for k in line]
        snap.live = {r: [_name(prefix.entries[prefix.block_keys[b]].tokens) if b in prefix.block_keys
                         else f"blk {b}" for b in cache.tables[s]]
                     for r, s in seqs.items() if s in cache.tables}
        snapshots.append(snap)
    return snapshots


def comparable(snapshots: list[Snapshot]) -> list[tuple]:
    """The walk without block ids, which may differ between two correct caches."""
    return [(sorted((n["name"], n["owners"], n["place"]) for n in s.nodes.values()), s.line, s.free_blocks)
            for s in snapshots]


def draw_prefix_tree(snap: Snapshot, step: int | None = None) -> None:
    """The cached blocks as a tree (a chain per prompt, sharing its common start), coloured by state,
    under a title naming the step; printed beside it, the eviction line, the live sequences and the
    free blocks. A cache that holds no block says so in the picture."""
    children: dict[int | None, list[int]] = {}
    for key, node in snap.nodes.items():
        children.setdefault(node["parent"], []).append(key)
    place: dict[int, tuple[float, float]] = {}
    rows = [0]

    def lay(key: int, depth: int) -> float:
        kids = sorted(children.get(key, []), key=lambda k: snap.nodes[k]["name"])
        if kids:
            y = sum(lay(k, depth + 1) for k in kids) / len(kids)
        else:
            y, rows[0] = -rows[0], rows[0] + 1
        place[key] = (depth, y)
        return y

    for root in sorted(children.get(None, []), key=lambda k: snap.nodes[k]["name"]):
        lay(root, 0)
    height = max(rows[0], 3)
    fig, tree = plt.subplots(figsize=(4.9, 0.7 * height + 1.6))
    for key, (x, y) in place.items():
        node = snap.nodes[key]
        if node["parent"] in place:
            px, py = place[node["parent"]]
            tree.plot([px + 0.9, x], [py + 0.3, y + 0.3], color="gray", lw=1, zorder=0)
        if node["owners"]:
            color, note = "tab:orange", f"held by {node['owners']}"
        elif node["place"]:
            color, note = "tab:green", f"evict #{node['place']}"
        else:
            color, note = "lightgray", "has a child"
        tree.add_patch(plt.Rectangle((x, y), 0.9, 0.6, facecolor=color, edgecolor="black"))
        tree.text(x + 0.45, y + 0.42, f"{node['name']} (blk {node['block']})", ha="center", va="center", fontsize=11)
        tree.text(x + 0.45, y + 0.16, note, ha="center", va="center", fontsize=11)
    if not place:
        total = snap.free_blocks
        tree.text(1.5, -0.5, f"no cached blocks:\nall {total} blocks of the pool are free", ha="center",
                  va="center", fontsize=11, color="dimgray")
    tree.set_xlim(-0.05, 3.0)
    tree.set_ylim(-height + 0.5, 1.0)
    tree.axis("off")
    title = ("" if step is None else f"step {step}: ") + snap.event
    tree.set_title("\n".join(textwrap.wrap(title, 44)), fontsize=11, loc="left")
    legend = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black") for c in ("tab:orange", "tab:green",
                                                                                  "lightgray")]
    tree.legend(legend, ["a sequence holds it", "evictable", "cached, a child hangs on it"], fontsize=11,
                loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False, handlelength=1)
    fig.tight_layout()
    print("\n".join(textwrap.wrap("eviction line (next first): " + (", ".join(snap.line) or "empty"), 60,
                                  subsequent_indent="  ")))
    print("live sequences (table): " + ("; ".join(f"{r}: {', '.join(t)}" for r, t in snap.live.items()) or "none"))
    print(f"free blocks: {snap.free_blocks}")
    plt.show()


# ---- what sharing saves as requests pile up --------------------------------------------------------------

def sharing_growth(max_requests: int = 16, system_tokens: int = 96, own_tokens: int = 8,
                   block_size: int = 16, prefix_class=PrefixCache) -> dict[str, list[int]]:
    """Tokens prefilled and blocks held after 1..max_requests requests sharing a system prompt,
    with the prefix cache and without it (the bookkeeping of the engine's cache, no model)."""
    system = list(range(1, system_tokens + 1))
    prompts = [system + [1000 + 100 * i + j for j in range(own_tokens)] for i in range(max_requests)]
    total = sum(blocks_needed(len(p), block_size) for p in prompts)
    prefix = prefix_class(_bookkeeping_cache(total, block_size))
    out = {"requests": [], "prefilled": [], "prefilled_without": [], "blocks": [], "blocks_without": []}
    prefilled = 0
    for seq, prompt in enumerate(prompts):
        prefilled += prefill(prefix, seq, prompt)
        out["requests"].append(seq + 1)
        out["prefilled"].append(prefilled)
        out["prefilled_without"].append(sum(len(p) for p in prompts[:seq + 1]))
        out["blocks"].append(prefix.cache.blocks_in_use)
        out["blocks_without"].append(sum(blocks_needed(len(p), block_size) for p in prompts[:seq + 1]))
    return out


def plot_sharing_growth(growth: dict[str, list[int]], title: str) -> None:
    """Two figures against the number of requests (side by side where they fit): prompt tokens
    prefilled, KV blocks held."""
    n = growth["requests"]
    for key, ylabel, name in (("prefilled", "prompt tokens prefilled", "Prefill work"),
                              ("blocks", "KV blocks held", "Memory")):
        fig, ax = plt.subplots(figsize=(4.4, 3.3))
        ax.plot(n, growth[f"{key}_without"], color="tab:red", marker=".", label="no prefix cache")
        ax.plot(n, growth[key], color="tab:blue", marker=".", label="prefix cache")
        ax.set(xlabel="requests served", ylabel=ylabel)
        ax.set_title(f"{name}\n{title}", fontsize=11)
        ax.legend(fontsize=11)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        plt.show()
