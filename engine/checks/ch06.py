"""Chapter 6's checks: a primer kernel, the paged decode kernel, split-K's merge, review answers.

The kernel checks launch the learner's Triton kernel through the engine's launchers
(`engine.attention.triton_primer.gather_rows`, `engine.attention.triton_decode.paged_decode_per_head`)
and compare with torch. When a result is wrong they recompute, in torch, what each classic bug
would have produced on the same inputs, and the hint names the bug whose output matches.

Without a GPU the kernels run in Triton's interpreter on the CPU; with one they run compiled (the
tensors go to CUDA for the launch). Where Triton cannot be installed (macOS, Windows) the kernel
checks fail with a message that says so, and the others still run.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import math
import os
import re
import textwrap
import traceback

import torch

from engine.attention import triton_installed
from engine.checks import (ATOL, Proved, answered_number, ceil_div, check, compare_logits, expect_equal, fail,
                           one_thread, passed)
from engine.seeded import seeded_tokens

NO_TRITON = ("Triton is not available on this platform (it ships Linux wheels only), so this kernel "
             "cannot run here. Run the chapter on Linux, in WSL2, or in a hosted notebook (Colab, Kaggle)")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3}
SENTINEL = -7.0          # what the primer's output buffer holds wherever nothing may be written


def _need_triton() -> None:
    if not triton_installed():
        fail(NO_TRITON)


def _device() -> torch.device:
    """Where a kernel launch runs: CUDA when the kernels are compiled, else the CPU (interpreter)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available()
    return torch.device("cpu" if interpreted else "cuda")


def launch(fn, *args, **kwargs):
    """Call a launcher here, where the check runs; a stub kernel's NotImplementedError comes back as itself.

    Triton's interpreter wraps an exception raised inside a kernel in an InterpreterError, and the
    compiler refuses a `raise` outright; either way the learner should read "not implemented yet".
    Under the grader the checks get the judge's own kernel (built from the cell's text and launched in
    the kernel process, engine.course.grading.sealed.kernelbox); an object of the notebook's process is never
    launched, nor handed a launch to run where it lives: the check fails (NOT_FROM_TEXT).
    """
    if any(hasattr(type(value), "call_there") for value in (*args, *kwargs.values())):
        fail(NOT_FROM_TEXT)
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:
        cause = exc
        while cause is not None and not isinstance(cause, NotImplementedError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        _name_the_kernel_line(exc, TILES.get(getattr(fn, "__name__", ""), ""))
        if type(exc).__name__ == "CompilationError" and "Loop-carried variable" in str(exc):
            fail(f"your kernel does not compile for this GPU: {_last_line(exc)}", hint=LOOP_CARRIED_HINT)
        if "NotImplementedError" in str(exc):   # compiled: Triton refuses the stub's `raise`
            plain = getattr(kwargs.get("kernel"), "fn", kwargs.get("kernel"))
            if callable(plain) and not hasattr(plain, "__getitem__"):
                try:                             # a stub raises at once, as plain Python, too
                    plain(*[None] * plain.__code__.co_argcount)
                except NotImplementedError:
                    raise
                except Exception:
                    pass
            raise NotImplementedError(f"the kernel still raises NotImplementedError "
                                      f"({type(exc).__name__})") from None
        raise


NOT_FROM_TEXT = ("your kernel reached the check as an object of your notebook's process, not as a kernel "
                 "written in its exercise cell: the grader launches only a kernel it reads from your cell's "
                 "text. Hint: define it in its exercise cell with def, in Triton's language (@triton.jit above "
                 "it is fine), and do not rebind its name in another cell")
_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SHAPES = re.compile(r"incompatible dimensions at index (\d+): (\d+) and (\d+)")


def _kernel_frame(exc: BaseException):
    """(function, line number, source) of the innermost frame of the learner's kernel in what `exc`
    wraps (Triton's interpreter raises InterpreterError from the kernel's own error), else None."""
    from engine.checks import _chain
    for error in reversed(list(_chain(exc, context=True))):       # the kernel's own error first
        for frame in reversed(traceback.extract_tb(error.__traceback__)):
            path = os.path.abspath(frame.filename)
            if "site-packages" in path or path.startswith(_ENGINE_DIR) or f"{os.sep}triton{os.sep}" in path:
                continue
            return error, frame
    return None


# What each launcher's tiles are, for a shape error's hint.
TILES = {"paged_decode_per_head": "The K/V tiles are [BLOCK_N, HEAD_DIM], positions on axis 0, so a mask over "
                                  "positions goes on axis 0 (valid[:, None]), not axis 1 (valid[None, :])",
         "gather_rows": "The tiles are [BLOCK_ROWS, BLOCK_COLS]: a condition on rows is r[:, None], one on "
                        "columns c[None, :]"}


def _name_the_kernel_line(exc: BaseException, tiles: str) -> None:
    """A crash inside the learner's interpreted kernel fails naming the kernel's line (not the launcher's)
    and, for a shape error, the two sizes that did not match."""
    found = _kernel_frame(exc)
    if found is None:
        return
    error, frame = found
    source = (frame.line or "").strip()
    what = f"your kernel crashed in {frame.name} (line {frame.lineno}: {source}) with {type(error).__name__}: {error}"
    shapes = _SHAPES.search(str(error))
    if shapes is None:
        fail(what, hint="run the kernel's lines one by one in your head with the tile shapes: each tl.load, "
                        "tl.store and tl.where needs its operands to broadcast to one shape")
    axis, one, other = shapes.groups()
    fail(what, hint=f"two operands of that line have different sizes on axis {axis} ({one} and {other}): a mask "
                    f"(or `other`) must have the pointer tile's shape or broadcast to it. {tiles}".rstrip(". "))


LOOP_CARRIED_HINT = ("a GPU compiles the loop with the type of every value it carries fixed before the loop "
                     "starts; the interpreter, plain numpy, does not care. Start each one as a Triton value of "
                     "its final shape and dtype: m = tl.full((), float('-inf'), tl.float32), "
                     "l = tl.zeros((), tl.float32), acc = tl.zeros((HEAD_DIM,), tl.float32)")


def _last_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def loop_carried_numbers(fn) -> list[tuple[str, str]]:
    """(name, start) of each value a loop of `fn` reassigns that was started before it as a Python number.

    `acc = 0.0` before a loop that makes it a vector, or `l = 0` before one that makes it a float, runs in
    the interpreter and fails to compile on a GPU; a scalar float start (`m = float("-inf")`) compiles.
    Which is which depends on shapes, so the interpreter's checks only warn. [] when there is no source.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn))))
    except (OSError, TypeError, SyntaxError):
        return []
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.FunctionDef) else []

    def number(node) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, ast.UnaryOp):
            return number(node.operand)
        if isinstance(node, ast.BinOp):
            return number(node.left) and number(node.right)
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("float", "int")
                and all(isinstance(a, ast.Constant) for a in node.args))

    starts: dict[str, ast.AST] = {}
    found = []
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                pairs = (zip(target.elts, stmt.value.elts) if isinstance(target, ast.Tuple)
                         and isinstance(stmt.value, ast.Tuple) else [(target, stmt.value)])
                starts.update({t.id: v for t, v in pairs if isinstance(t, ast.Name)})
        elif isinstance(stmt, (ast.For, ast.While)):
            assigned = {t.id for node in ast.walk(stmt) if isinstance(node, (ast.Assign, ast.AugAssign))
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                        for t in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(t, ast.Name)}
            found += [(name, ast.unparse(starts[name])) for name in sorted(assigned)
                      if name in starts and number(starts[name])]
    return found


def warn_loop_carried(fn) -> None:
    """Print a warning line (not a failure) for each loop-carried value started as a Python number."""
    found = loop_carried_numbers(fn)
    if found:
        listed = ", ".join(f"{name} = {start}" for name, start in found)
        print(f"⚠ your kernel starts {listed} as Python numbers before the loop that changes them. Fine in "
              f"the interpreter; on a GPU a value that becomes a vector (or an int that becomes a float) "
              f"does not compile. Hint: {LOOP_CARRIED_HINT}")


def _show(t: torch.Tensor, digits: int = 2) -> str:
    """A small tensor as aligned text, one row per line (for expected/got displays)."""
    t = t.detach().cpu()
    if t.ndim == 1:
        t = t[None]
    cells = [[("nan" if math.isnan(v) else f"{v:.{digits}f}") if isinstance(v, float) else str(v)
              for v in row] for row in t.tolist()]
    width = max(len(c) for row in cells for c in row)
    return "\n".join("    " + " ".join(c.rjust(width) for c in row) for row in cells)


# ---- the primer: gather rows through an index ----------------------------------------------------

def _gather_case(x_rows: int, cols: int, index: list[int], block_rows: int, seed: int):
    """x, index and out as views into guarded buffers: NaN right of x's columns, SENTINEL around out."""
    gen = torch.Generator().manual_seed(seed)
    block_cols = 1 << max(cols - 1, 0).bit_length()
    x_buf = torch.full((x_rows, block_cols + 4), float("nan"))
    x_buf[:, :cols] = torch.randn(x_rows, cols, generator=gen).round(decimals=1)
    rows = len(index)
    idx_buf = torch.zeros(rows + 2 * block_rows, dtype=torch.long)       # past the end: row 0
    idx_buf[:rows] = torch.tensor(index)
    out_buf = torch.full((rows + 2 * block_rows, block_cols + 4), SENTINEL)
    return x_buf, idx_buf, out_buf, rows, cols


def _gather_bugs(x_buf, idx_buf, rows, cols, block_rows, out_shape):
    """(hint, what the out buffer would hold) for each classic bug of the primer kernel."""
    block_cols = 1 << max(cols - 1, 0).bit_length()
    index = idx_buf[:rows]
    right = torch.full(out_shape, SENTINEL)
    right[:rows, :cols] = x_buf[index, :cols]
    bugs = []
    ignored = right.clone()
    ignored[:rows, :cols] = x_buf[torch.arange(rows) % x_buf.shape[0], :cols]
    bugs.append(("row r of out came from row r of x: load index[r] first and read row index[r] of x "
                 "(the index is the block table of this toy)", ignored))
    flat = x_buf.flatten()
    stride = right.clone()
    addr = index[:, None] * cols + torch.arange(cols)[None, :]
    stride[:rows, :cols] = flat[addr]
    bugs.append(("the rows come from the wrong addresses: row i of x starts at x_ptr + i * s_x "
                 "(its stride), not i * cols; x here is a view whose rows are further apart", stride))
    first = right.clone()
    first[block_rows:rows, :cols] = SENTINEL
    bugs.append(("only the first tile of rows was written: every program must offset its rows by "
                 "tl.program_id(0) * BLOCK_ROWS", first))
    padded_rows = ceil_div(rows, block_rows) * block_rows
    no_row_mask = right.clone()
    no_row_mask[rows:padded_rows, :cols] = x_buf[idx_buf[rows:padded_rows], :cols]
    bugs.append((f"it wrote rows {rows}..{padded_rows - 1}, past the last row: the last tile is only "
                 "partly inside out; mask the store (and the index load) with r < rows", no_row_mask))
    no_col_mask = right.clone()
    no_col_mask[:rows, :block_cols] = x_buf[index, :block_cols]
    bugs.append((f"it wrote columns {cols}..{block_cols - 1} (NaN read past the end of each row of x): "
                 f"BLOCK_COLS = {block_cols} is a power of 2 wider than the {cols} columns, so mask "
                 "the columns too, c < cols", no_col_mask))
    return right, bugs


def launch_gather(kernel, x_buf, idx_buf, out_buf, rows: int, cols: int, block_rows: int) -> torch.Tensor:
    """Launch `gather_rows` on views of the guarded buffers and return the whole out buffer. The views are
    cut on the device the kernel runs on; a write outside out[:rows, :cols] shows in the buffer (the
    grader's kernel process sends back each tensor's whole storage)."""
    from engine.attention.triton_primer import gather_rows
    dev = _device()
    x_dev, idx_dev, out_dev = x_buf.to(dev), idx_buf.to(dev), out_buf.to(dev)
    launch(gather_rows, x_dev[:, :cols], idx_dev[:rows], out=out_dev[:rows, :cols], kernel=kernel,
           block_rows=block_rows)
    out_buf.copy_(out_dev.cpu())
    return out_buf


def _diff_positions(got: torch.Tensor, want: torch.Tensor) -> list[tuple[int, int]]:
    same = (got == want) | (got.isnan() & want.isnan())
    return [tuple(p) for p in (~same).nonzero().tolist()]


def _gather_cases(seed: int) -> list[tuple]:
    """(x rows, cols, index, BLOCK_ROWS, seed) of each launch: ragged tiles, narrow columns, repeats."""
    cases = [(9, 5, [8, 0, 3, 3, 7, 1, 2], 4, seed), (6, 16, [5, 4, 3, 2, 1, 0], 4, seed + 1),
             (4, 3, [2], 4, seed + 2), (12, 7, [11, 0, 5, 5, 9, 2, 8, 1, 10, 3], 4, seed + 3)]
    if seed:
        gen = torch.Generator().manual_seed(seed)
        cases.append((10, 6, torch.randint(0, 10, (9,), generator=gen).tolist(), 2, seed + 4))
    return cases


def _gather_hint(got, want, bugs, wrong, rows: int, cols: int) -> str:
    """The bug whose emulated output matches; else what the wrong entries' places say."""
    hint = next((h for h, emulated in bugs if not _diff_positions(got, emulated)), None)
    if hint is not None:
        return hint
    right_of = sorted({c for r, c in wrong if r < rows and c >= cols})
    below = sorted({r for r, c in wrong if r >= rows})
    if right_of:
        return (f"it wrote columns {right_of[0]}..{right_of[-1]} of out's rows, right of its {cols} columns: "
                f"the store's mask must bound the columns too (c < cols), not only the rows; a masked-off "
                f"load gives no value there, the store still writes it")
    if below:
        return (f"it wrote rows {below[0]}..{below[-1]}, past out's {rows} rows: mask the store with "
                f"r < rows as well as c < cols")
    return "compare the rows that differ with x[index]: which row of x did they come from?"


@check
def check_gather_rows(kernel, seed: int = 0) -> None:
    """The primer's kernel: out[r, :] = x[index[r], :] through `gather_rows`, edges masked."""
    _need_triton()
    cases = _gather_cases(seed)
    proved = Proved("gather_rows")
    for x_rows, cols, index, block_rows, seed in cases:
        x_buf, idx_buf, out_buf, rows, cols = _gather_case(x_rows, cols, index, block_rows, seed)
        got = launch_gather(kernel, x_buf, idx_buf, out_buf, rows, cols, block_rows)
        want, bugs = _gather_bugs(x_buf, idx_buf, rows, cols, block_rows, tuple(out_buf.shape))
        wrong = _diff_positions(got, want)
        if wrong:
            inside = [p for p in wrong if p[0] < rows and p[1] < cols]
            shown_rows = max(rows, max(p[0] for p in wrong) + 1)
            shown_cols = max(cols, max(p[1] for p in wrong) + 1)
            fail(f"gather_rows with x of {x_rows}x{cols}, index {index}, BLOCK_ROWS={block_rows}: "
                 f"{len(wrong)} entries differ ({len(inside)} inside out[:{rows}, :{cols}], "
                 f"{len(wrong) - len(inside)} outside it, where {SENTINEL:g} must stay), first at (row, col) "
                 f"{wrong[0]}.\n  expected (the out buffer, {SENTINEL:g} = never written):\n"
                 f"{_show(want[:shown_rows, :shown_cols], 1)}\n  got:\n{_show(got[:shown_rows, :shown_cols], 1)}\n",
                 hint=_gather_hint(got, want, bugs, wrong, rows, cols))
        _note_gather_case(proved, rows, cols, index, block_rows)
    proved.passed(f"{len(cases)} launches match x[index]")


def _note_gather_case(proved: Proved, rows: int, cols: int, index: list[int], block_rows: int) -> None:
    """What a launch that matched the whole guarded out buffer showed."""
    if rows % block_rows:
        proved.note("ragged last tiles")
    if cols & (cols - 1):
        proved.note("columns narrower than the tile")
    if len(set(index)) < len(index):
        proved.note("repeated indices")
    proved.note(f"every entry outside out[:rows, :cols] kept its {SENTINEL:g}, so nothing there was written")


# ---- the paged decode kernel ----------------------------------------------------------------------

def decode_case(lens: list[int], group: int, kv_heads: int = 2, block_size: int = 4, head_dim: int = 16,
                dtype=torch.float32, block_n: int = 8, seed: int = 0, garbage: str = "random",
                q_scale: float = 1.0, spare: int = 3) -> dict:
    """Inputs for one decode launch: scrambled tables over a pool with spare blocks.

    Every slot no sequence owns (the tails of last blocks, spare blocks, and the garbage block the
    table padding points to) holds `garbage`: "random" values, or "nan". The table is wide enough
    that even a kernel without a tail mask reads only inside the pool.
    """
    gen = torch.Generator().manual_seed(seed)
    counts = [ceil_div(n, block_size) for n in lens]
    width = max(ceil_div(ceil_div(n, block_n) * block_n, block_size) for n in lens) + 1
    num_blocks = sum(counts) + spare + 1
    shape = (num_blocks, kv_heads, block_size, head_dim)
    k_pool = torch.randn(shape, generator=gen)
    v_pool = torch.randn(shape, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    junk = order.pop()                                  # the block table padding names
    tables = torch.full((len(lens), width), junk, dtype=torch.long)
    used = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for row, (n, count) in enumerate(zip(lens, counts)):
        tables[row, :count] = torch.tensor(order[:count])
        order = order[count:]
        for p in range(n):
            used[tables[row, p // block_size], p % block_size] = True
    if garbage == "nan":
        for pool in (k_pool, v_pool):
            pool.masked_fill_(~used[:, None, :, None], float("nan"))
    q = torch.randn(len(lens), kv_heads * group, 1, head_dim, generator=gen) * q_scale
    kv_lens = torch.tensor(lens)
    return dict(q=q.to(dtype), k_pool=k_pool.to(dtype), v_pool=v_pool.to(dtype), block_tables=tables,
                q_positions=(kv_lens - 1)[:, None], kv_lens=kv_lens, block_n=block_n, group=group)


def run_decode(kernel, case: dict) -> torch.Tensor:
    """The learner's kernel on one case through the engine's launcher: [B, Hq, D] on the CPU. In Triton's
    interpreter a kernel whose output is right but that read block-table entries past a row's last block
    fails here (see _table_reads_past_rows); a wrong output is left to the checks' diagnosis."""
    from engine.attention.triton_decode import paged_decode_per_head
    dev = _device()
    args = [case[name].to(dev) for name in ("q", "k_pool", "v_pool", "block_tables", "q_positions", "kv_lens")]
    with _table_reads_past_rows(kernel, args[3], case) as past:
        out = launch(paged_decode_per_head, *args, kernel=kernel, block_n=case["block_n"])[:, :, 0].cpu()
    if past and _close(out, reference(case), case):
        (row, column), counts = past[0], _blocks_per_row(case)
        fail(f"your paged decode kernel ({_describe(case)}) read block-table entries past a row's last block: "
             f"row {row} has {counts[row]} block(s) for its {int(case['kv_lens'][row])} tokens, and the kernel "
             f"loaded its column {column} ({len(past)} such entries in all)", hint=UNMASKED_TABLE)
    return out


UNMASKED_TABLE = ("the block-table load has no mask: the last tile's positions past the sequence's length "
                  "read entries past the row's last block. Here those are padding; in the engine the table is "
                  "only as wide as the longest row, so on a GPU such a read can leave the tensor. Load the "
                  "table with the positions' mask too: tl.load(..., mask=valid, other=0)")


def _blocks_per_row(case: dict) -> list[int]:
    return [ceil_div(n, case["k_pool"].shape[2]) for n in case["kv_lens"].tolist()]


@contextlib.contextmanager
def _table_reads_past_rows(kernel, table: torch.Tensor, case: dict):
    """Around one launch in Triton's interpreter: yields a list that holds, once the launch is over, the
    (row, column) of each block-table entry the kernel loaded (mask on) past its row's last block, in
    row order. The kernel's loads are watched where it runs: here, or in the grader's kernel process
    (its `loads_of`, which reports the bytes it loaded; engine.course.grading.sealed.kernelbox). A compiled
    launch is not watched (the list stays empty)."""
    past: list[tuple[int, int]] = []
    counts = torch.tensor(_blocks_per_row(case))
    loads_of = getattr(type(kernel), "loads_of", None)      # the judge's own kernel object, never the host's
    if loads_of is not None:
        with loads_of(kernel, table) as loads:
            yield past
        read = loads.read().cpu()
    elif os.environ.get("TRITON_INTERPRET") != "1" or table.device.type != "cpu":
        yield past
        return
    else:
        with _interpreter_loads(table) as flags:
            yield past
        read = flags.as_strided(tuple(table.shape), tuple(table.stride()), table.storage_offset())
    rows, columns = read.nonzero(as_tuple=True)
    beyond = columns >= counts[rows]
    past.extend(zip(rows[beyond].tolist(), columns[beyond].tolist()))


@contextlib.contextmanager
def _interpreter_loads(table: torch.Tensor):
    """Yields a flag per element of `table`'s storage, set as a launch in this process's interpreter
    loads (mask on) that element."""
    import numpy as np
    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    base, item = table.untyped_storage().data_ptr(), table.element_size()
    flags = torch.zeros(table.untyped_storage().nbytes() // item, dtype=torch.bool)
    marks = flags.numpy()
    load = builder.create_masked_load

    def watched(ptrs, mask, *rest):
        addresses = np.asarray(ptrs.data).astype(np.int64, copy=False)
        on = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        elements = (addresses[on] - base) // item
        marks[elements[(elements >= 0) & (elements < len(marks))]] = True
        return load(ptrs, mask, *rest)

    builder.create_masked_load = watched
    try:
        yield flags
    finally:
        vars(builder).pop("create_masked_load", None)


def reference(case: dict) -> torch.Tensor:
    """The engine's torch reference on the case: [B, Hq, D]."""
    from engine.attention.paged_reference import paged_attention_reference
    names = ("q", "k_pool", "v_pool", "block_tables", "q_positions", "kv_lens")
    return paged_attention_reference(*(case[n] for n in names))[:, :, 0]


BUGS = {
    "unmasked_tail": "it attends to slots past the sequence's length (the tail of its last block, or "
                     "the rest of the last tile): mask positions pos >= length, in the scores (-inf) "
                     "and in the K and V loads",
    "kv_head_modulo": "query heads read the wrong KV head: with grouped-query attention the `group` "
                      "heads h = g*group .. g*group+group-1 share KV head g, so it is h // group, "
                      "not h % Hkv",
    "logical_block": "it reads logical block p // BLOCK_SIZE as if it were the physical block: load "
                     "the physical id from the block table, tables[b, p // BLOCK_SIZE]",
    "no_scale": "the scores are not scaled: multiply q.k by scale = 1/sqrt(head_dim)",
    "no_max": "the softmax does not subtract the running max: exp(score) overflows to inf once a "
              "score passes ~88 (float32; ~11 in fp16), and inf/inf is NaN. Use exp(score - m) "
              "with m the running max",
    "no_rescale": "the online softmax never rescales: when the running max grows from m to m_new, "
                  "multiply l and acc by alpha = exp(m - m_new) before adding the new tile",
    "row_zero_table": "every sequence reads row 0 of the block table: row b starts at "
                      "tables_ptr + b * s_tb",
    "table_row_stride": "it reads the wrong row of the block table: row b starts at "
                        "tables_ptr + b * s_tb (the table's row stride), not tables_ptr + b",
}


def emulate(case: dict, bug: str | None = None) -> torch.Tensor:
    """What a per-head decode kernel computes on `case`, correct or with one classic bug: [B, Hq, D]."""
    q, k_pool, v_pool = case["q"].float(), case["k_pool"].float(), case["v_pool"].float()
    tables, group, block_n = case["block_tables"], case["group"], case["block_n"]
    lengths = torch.minimum(case["q_positions"][:, 0] + 1, case["kv_lens"]).clamp(min=1)
    batch, q_heads, _, head_dim = q.shape
    kv_heads, block_size = k_pool.shape[1], k_pool.shape[2]
    scale = 1.0 if bug == "no_scale" else head_dim ** -0.5
    out = torch.empty(batch, q_heads, head_dim)
    for b in range(batch):
        n = int(lengths[b])
        span = ceil_div(n, block_n) * block_n if bug == "unmasked_tail" else n
        pos = torch.arange(span)
        blocks = {"logical_block": pos // block_size, "row_zero_table": tables[0, pos // block_size],
                  "table_row_stride": tables.flatten()[b + pos // block_size]}.get(bug, tables[b, pos // block_size])
        slots = pos % block_size
        for h in range(q_heads):
            kv = h % kv_heads if bug == "kv_head_modulo" else h // group
            k, v = k_pool[blocks, kv, slots], v_pool[blocks, kv, slots]
            scores = k @ q[b, h, 0] * scale
            if bug == "no_max":
                weights = torch.exp(scores)
                out[b, h] = (weights @ v) / weights.sum()
            elif bug == "no_rescale":
                l, acc = torch.zeros(()), torch.zeros(head_dim)
                for start in range(0, n, block_n):
                    s, vals = scores[start:start + block_n], v[start:start + block_n]
                    p = torch.exp(s - scores[:start + block_n].max())
                    l, acc = l + p.sum(), acc + p @ vals
                out[b, h] = acc / l
            else:
                out[b, h] = torch.softmax(scores, dim=0) @ v
    return out.to(case["q"].dtype).float()


def _tolerance(case: dict) -> float:
    """The dtype's tolerance; scores in the hundreds lose more bits to float32 rounding (GPU exp too)."""
    tol = TOLERANCE[case["q"].dtype]
    return max(tol, 2e-4) if case.get("large") else tol


def _close(got: torch.Tensor, want: torch.Tensor, case: dict) -> bool:
    tol = _tolerance(case)
    return torch.allclose(got.float(), want.float(), atol=tol, rtol=tol, equal_nan=True)


def diagnose(case: dict, got: torch.Tensor, bugs=tuple(BUGS)) -> str | None:
    """The hint of the first classic bug whose emulation reproduces `got`, or None."""
    for bug in bugs:
        if _close(got, emulate(case, bug), case):
            return BUGS[bug]
    return None


def _describe(case: dict) -> str:
    q = case["q"]
    return (f"{q.dtype} decode, lengths {case['kv_lens'].tolist()}, {q.shape[1]} query heads over "
            f"{case['k_pool'].shape[1]} KV heads (group {case['group']}), blocks of {case['k_pool'].shape[2]}, "
            f"BLOCK_N={case['block_n']}, tables {case['block_tables'].tolist()}")


def _expect_decode(got: torch.Tensor, want: torch.Tensor, case: dict, what: str, hint: str | None = None) -> None:
    """Fail with the first differing (sequence, head), expected vs got, and a diagnosed hint."""
    if got.shape != want.shape:
        fail(f"{what}: the output has the wrong shape", tuple(want.shape), tuple(got.shape))
    if _close(got, want, case) and torch.isfinite(got).all():
        return
    tol = _tolerance(case)
    bad = ~torch.isclose(got.float(), want.float(), atol=tol, rtol=tol)
    b, h = (int(i) for i in bad.any(dim=-1).nonzero()[0])
    rows = bad.any(dim=-1).nonzero().tolist()
    hint = diagnose(case, got) or hint or (
        "compare the wrong (sequence, head) pairs: all heads of one sequence wrong points at the table "
        "or the length; only some heads at the KV head; everything at the scale or the softmax")
    fail(f"{what} ({_describe(case)}): {len(rows)} of {got.shape[0] * got.shape[1]} (sequence, head) "
         f"outputs differ from the torch reference, first at sequence {b}, head {h} "
         f"(length {int(case['kv_lens'][b])}).\n  expected out[{b}, {h}]:\n{_show(want[b, h][:8])} ...\n"
         f"  got:\n{_show(got[b, h][:8])} ...\n  wrong (sequence, head): {rows[:8]}", hint=hint)


def decode_cases(seed: int = 0) -> list[dict]:
    """Scrambled tables, lengths 1 to a few blocks, groups 1/2/4, fp32 and fp16, tiles that cut blocks.

    Small on purpose: the interpreter runs every program in Python (and slower still under the grader).
    """
    return [
        decode_case([1, 4, 9], group=1, block_size=4, block_n=8, seed=seed),
        decode_case([2, 7], group=2, block_size=3, block_n=4, seed=seed + 1),
        decode_case([17], group=4, block_size=16, block_n=16, seed=seed + 2, dtype=torch.float16),
        decode_case([4, 9], group=2, block_size=4, block_n=8, seed=seed + 3, dtype=torch.float16),
    ]


def _decode_cases_covered(cases: list[dict]) -> str:
    """What the launches that matched covered, read off the cases themselves."""
    def listed(values) -> str:
        values = [str(v) for v in sorted(set(values))]
        return values[0] if len(values) == 1 else ", ".join(values[:-1]) + f" and {values[-1]}"
    lens = [n for case in cases for n in case["kv_lens"].tolist()]
    sizes = [case["k_pool"].shape[2] for case in cases]
    cut = sum(case["block_n"] % size != 0 for case, size in zip(cases, sizes))
    kinds = listed(str(case["q"].dtype).removeprefix("torch.").replace("float", "fp") for case in cases)
    return (f"{len(cases)} launches (groups {listed(case['group'] for case in cases)}, {kinds}, blocks of "
            f"{listed(sizes)}, lengths {min(lens)} to {max(lens)}" + (f", {cut} with tiles that cut blocks)"
                                                                     if cut else ")"))


@check
def check_decode_kernel(kernel, seed: int = 0) -> None:
    """The per-head paged decode kernel equals the engine's torch reference on scrambled tables."""
    _need_triton()
    cases = decode_cases(seed)
    for case in cases:
        _expect_decode(run_decode(kernel, case), reference(case), case, "your paged decode kernel")
    passed(f"paged decode kernel: {_decode_cases_covered(cases)} match the torch reference on scrambled "
           f"block tables")
    warn_loop_carried(kernel)


@check
def check_decode_garbage(kernel) -> None:
    """NaN in every slot no sequence owns (tails of last blocks, spare blocks, table padding) changes nothing."""
    _need_triton()
    for group, block_size, lens in ((2, 4, [3, 9]), (1, 5, [4, 5, 11])):
        clean = decode_case(lens, group=group, block_size=block_size, block_n=8, seed=7)
        dirty = decode_case(lens, group=group, block_size=block_size, block_n=8, seed=7, garbage="nan")
        want = reference(clean)
        got = run_decode(kernel, dirty)
        if torch.isfinite(got).all() and _close(got, want, clean):
            continue
        clean_got = run_decode(kernel, clean)
        if not _close(clean_got, want, clean):
            _expect_decode(clean_got, want, clean, "before any NaN: your kernel on random garbage")
        nan_rows = sorted({int(b) for b in (~torch.isfinite(got)).any(dim=-1).any(dim=-1).nonzero()[:, 0]})
        fail(f"{_describe(dirty)}: with NaN in the slots no sequence owns, sequences {nan_rows} come "
             f"back NaN, though they are right when those slots hold ordinary numbers",
             hint="a load past the sequence's length reads a slot that is not this sequence's: it may "
                  "hold anything (stale keys, NaN). Setting those scores to -inf is not enough, because "
                  "p = 0 times a NaN value is NaN: mask the K and V loads too (mask=valid, other=0.0)")
    passed("garbage stays out: NaN in last-block tails, spare blocks and table padding never reaches "
           "the output")


def _max_score(case: dict) -> float:
    """The largest scaled score q.k / sqrt(D) any query of the case sees."""
    q, k_pool, tables = case["q"].float(), case["k_pool"].float(), case["block_tables"]
    best = float("-inf")
    for b, n in enumerate(case["kv_lens"].tolist()):
        pos = torch.arange(n)
        for h in range(q.shape[1]):
            keys = k_pool[tables[b, pos // k_pool.shape[2]], h // case["group"], pos % k_pool.shape[2]]
            best = max(best, float((keys @ q[b, h, 0]).max()) * q.shape[-1] ** -0.5)
    return best


@check
def check_decode_large_scores(kernel) -> None:
    """Scores far above 88 (exp overflows float32): the online softmax must subtract its running max."""
    _need_triton()
    cases = [decode_case([6, 13], group=2, block_size=4, block_n=8, seed=11, q_scale=60.0),
             decode_case([6, 13], group=2, block_size=4, block_n=8, seed=12, q_scale=60.0,
                         dtype=torch.float16)]
    for case in cases:
        case["large"] = True
        scores = _max_score(case)
        got = run_decode(kernel, case)
        _expect_decode(got, reference(case), case, f"large scores (up to about {scores:.0f})")
    passed(f"large scores: queries scaled by 60 give scores up to ~{scores:.0f}, far past exp's float32 "
           "range, and the online softmax stays finite and exact in fp32 and fp16")


def kernel_cache_class(kernel, block_n: int = 32):
    """The engine's PagedKVCache with `kernel` attending every decode step (T == 1); prefill stays torch."""
    from engine.attention.triton_decode import paged_decode_per_head
    from engine.cache.paged import PagedKVCache

    class KernelCache(PagedKVCache):
        def attend(self, layer, q, k, v, positions):
            if q.shape[2] != 1:
                return super().attend(layer, q, k, v, positions)
            kv_lens = self.write(layer, k, v, positions)
            dev = _device()
            args = (q.to(self.dtype), self.k_pools[layer], self.v_pools[layer], self.block_tables, positions,
                    kv_lens)
            out = launch(paged_decode_per_head, *(t.to(dev) for t in args), kernel=kernel, block_n=block_n)
            return out.to(q.device, q.dtype)

    return KernelCache


@functools.lru_cache(maxsize=None)
def engine_model():
    """The milestone's model: the course's tiny Qwen3 cut to 1 layer with 1 attention head.

    Every decode step launches the kernel once per layer with a program per (sequence, head), and
    the interpreter runs each program in Python (under the grader's watch, several times slower
    still): one head keeps 20 steps of a 4-sequence batch to 80 programs. Heads, groups and
    strides are covered by the other kernel checks.
    """
    from engine.checkpoint import tiny_model
    return tiny_model(seed=0, num_layers=1, num_heads=1, num_kv_heads=1)



@check
def check_decode_in_engine(kernel, lengths=None, block_size: int = 4, steps: int = 20) -> None:
    """The milestone: the kernel in the engine's paged cache gives from-scratch logits over a ragged
    batch of prompts (default bs-1, bs, bs+1, 2bs+1 tokens), prefill then `steps` decode steps."""
    _need_triton()
    bs = block_size
    lens = list(lengths or [bs - 1, bs, bs + 1, 2 * bs + 1])
    with one_thread():
        _decode_in_engine(kernel, lens, bs, steps)


def _decode_in_engine(kernel, lens: list[int], bs: int, steps: int) -> None:
    from engine.generate import cached_step, scratch_logits
    model = engine_model()
    prompts = [seeded_tokens(n, seed=60 + n) for n in lens]
    blocks = sum(ceil_div(n + steps, bs) for n in lens) + 4
    cache = kernel_cache_class(kernel)(model.config, blocks, block_size=bs, attention="torch")
    seqs = list(range(len(lens)))
    for s in seqs:
        cache.create(s)
    got = [list(rows) for rows in cached_step(model, cache, seqs, prompts)]
    tokens = [list(p) for p in prompts]
    for t in range(steps):
        new = [[seeded_tokens(1, seed=1000 * t + s)[0]] for s in seqs]
        for s, row in enumerate(cached_step(model, cache, seqs, new)):
            got[s].append(row[-1])
            tokens[s] += new[s]
    want = scratch_logits(model, tokens)
    worst = 0.0
    for s in seqs:
        decode = torch.stack(got[s][lens[s]:])
        worst = max(worst, compare_logits(
            decode, want[s][lens[s]:], f"sequence {s} (prompt of {lens[s]} tokens, blocks of {bs}), decode "
            f"through your kernel", first_position=lens[s],
            hint="run check_decode_kernel first; if it passes, the engine's pool holds each token at "
                 "slot p % block_size of block table[p // block_size], and kv_len grows by one a step"))
    expect_equal(len(got[0]), lens[0] + steps, "logit rows for sequence 0")
    passed(f"in the engine: prefill of {lens} tokens (blocks of {bs}), then {steps} decode steps through "
           f"your kernel (the tiny Qwen3 cut to 1 layer, 1 head); every logit matches a "
           f"from-scratch run (max |Δ| {worst:.1e} <= {ATOL:g})")


# ---- stretch: split-K's log-sum-exp merge ----------------------------------------------------------

def split_case(lens: list[int], num_splits: int, heads: int = 2, head_dim: int = 8, seed: int = 0,
               offset: float = 0.0):
    """Partials (m, l, acc) of per-slice softmaxes, computed in torch, and the whole-history output.

    Scores are 4 x randn + `offset`: an offset of 100 puts every max past exp's float32 range (~88).
    """
    gen = torch.Generator().manual_seed(seed)
    batch = len(lens)
    m = torch.full((batch, heads, num_splits), float("-inf"))
    l = torch.zeros(batch, heads, num_splits)
    acc = torch.zeros(batch, heads, num_splits, head_dim)
    whole = torch.zeros(batch, heads, head_dim)
    for b, n in enumerate(lens):
        scores = torch.randn(heads, n, generator=gen) * 4 + offset
        values = torch.randn(heads, n, head_dim, generator=gen)
        if n:
            whole[b] = torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=-1), values)
        per = ceil_div(n, num_splits) if n else 0
        for s in range(num_splits):
            lo, hi = s * per, min(n, (s + 1) * per)
            if lo >= hi:
                continue                                   # an empty slice: m = -inf, l = 0, acc = 0
            part = scores[:, lo:hi]
            m[b, :, s] = part.max(dim=-1).values
            p = torch.exp(part - m[b, :, s, None])
            l[b, :, s] = p.sum(dim=-1)
            acc[b, :, s] = torch.einsum("hn,hnd->hd", p, values[:, lo:hi])
    return m, l, acc, whole


def _merged(acc_weight: torch.Tensor, l_weight: torch.Tensor, acc: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """sum_s acc_weight_s acc_s / sum_s l_weight_s l_s, exactly as written (no guard against 0 or NaN)."""
    return (acc_weight[..., None] * acc).sum(-2) / (l_weight * l).sum(-1, keepdim=True)


def _global_max(m: torch.Tensor) -> torch.Tensor:
    top = m.amax(-1, keepdim=True)
    return torch.where(top == float("-inf"), torch.zeros_like(top), top)


# The classic wrong merges, by class: (hint, what the merge returns). The weights of acc and of l, the max
# they are taken against, and the normalization; each is recomputed on the check's inputs and compared
# with the learner's output, and the first that reproduces it is named.
MERGE_BUGS = {
    "l_unweighted": (
        "the denominator adds the slices' l_s as they are, sum_s l_s: each l_s was summed against its own "
        "max m_s, so it needs the same weight as acc_s. Divide by sum_s exp(m_s - M) l_s",
        lambda m, l, acc: _merged(torch.exp(m - _global_max(m)), torch.ones_like(m), acc, l)),
    "acc_unweighted": (
        "the numerator adds the slices' acc_s as they are, sum_s acc_s: each acc_s was summed against its "
        "own max m_s, so it needs the same weight as l_s. Add up exp(m_s - M) acc_s",
        lambda m, l, acc: _merged(torch.ones_like(m), torch.exp(m - _global_max(m)), acc, l)),
    "unweighted": (
        "each slice's l and acc were summed against its own max m_s: weight them by exp(m_s - M), with M "
        "the largest m_s, before adding them up",
        lambda m, l, acc: _merged(torch.ones_like(m), torch.ones_like(m), acc, l)),
    "averaged": (
        "averaging the slices' normalized outputs weighs a 1-key slice like a 30-key one: weight each "
        "slice by exp(m_s - M) * l_s, i.e. sum the rescaled acc and l, then divide",
        lambda m, l, acc: (torch.where(l[..., None] > 0, acc / l[..., None], torch.zeros_like(acc)).sum(-2)
                           / (l > 0).sum(-1, keepdim=True).clamp(min=1))),
    "acc_times_l": (
        "acc_s is already a sum over the slice's keys (unnormalized, like l_s): weight it by exp(m_s - M) "
        "alone, not by exp(m_s - M) * l_s",
        lambda m, l, acc: _merged(torch.exp(m - _global_max(m)) * l, torch.exp(m - _global_max(m)), acc, l)),
    "weights_inverted": (
        "the weights are exp(M - m_s), upside down: a slice whose max m_s is below the global max M must "
        "weigh less than 1, exp(m_s - M)",
        lambda m, l, acc: _merged(torch.exp(_global_max(m) - m), torch.exp(_global_max(m) - m), acc, l)),
    "no_division": (
        "the output is the weighted sum of acc_s alone: divide it by the weighted sum of the l_s, "
        "sum_s exp(m_s - M) l_s",
        lambda m, l, acc: (torch.exp(m - _global_max(m))[..., None] * acc).sum(-2)),
    "max_not_subtracted": (
        "the weights are exp(m_s) without subtracting the largest max M: once a slice's max passes ~88, "
        "exp overflows float32 to inf, and inf/inf is NaN. Weight by exp(m_s - M), M = max_s m_s",
        lambda m, l, acc: _merged(torch.exp(m), torch.exp(m), acc, l)),
    "min_instead_of_max": (
        "M must be the largest m_s: with the smallest, an empty slice (m_s = -inf) makes M = -inf and every "
        "weight exp(m_s - M) infinite or NaN, and otherwise the weights overflow",
        lambda m, l, acc: _merged(torch.exp(m - m.amin(-1, keepdim=True)), torch.exp(m - m.amin(-1, keepdim=True)),
                                  acc, l)),
    "max_over_wrong_axis": (
        "M is a max over the wrong axis: take it over the slices of one row (the last axis of m, "
        "m.amax(dim=-1, keepdim=True)), not over heads or sequences",
        lambda m, l, acc: _merged(torch.exp(m - _global_max(m.transpose(-1, -2)).transpose(-1, -2)),
                                  torch.exp(m - _global_max(m.transpose(-1, -2)).transpose(-1, -2)), acc, l)),
}


def diagnose_merge(got: torch.Tensor, m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor,
                   rows: torch.Tensor) -> str | None:
    """The hint of the first MERGE_BUGS entry that reproduces `got` on the rows (sequence, head) `rows`."""
    for hint, wrong in MERGE_BUGS.values():
        with torch.no_grad():
            emulated = wrong(m.clone(), l.clone(), acc.clone())
        if emulated.shape == got.shape and torch.allclose(got[rows], emulated[rows], atol=1e-5, rtol=1e-5,
                                                          equal_nan=True):
            return hint
    return None


MERGE_CASES = (([1, 7, 30, 0], 4, 0.0), ([16, 3], 8, 0.0), ([50], 1, 0.0), ([9, 40, 0], 4, 100.0))


@check
def check_merge_partials(merge) -> None:
    """merge(m, l, acc) equals attention over the whole history, skips empty slices, gives 0 for a row
    whose slices are all empty, and stays finite when the scores are far past exp's range."""
    for lens, splits, offset in MERGE_CASES:
        m, l, acc, whole = split_case(lens, splits, seed=len(lens) + splits, offset=offset)
        got = merge(m.clone(), l.clone(), acc.clone())
        if tuple(got.shape) != tuple(whole.shape):
            fail(f"merge of {splits} splits: the output shape", tuple(whole.shape), tuple(got.shape),
                 "reduce over the split axis: m, l [..., S], acc [..., S, D] give [..., D]")
        got = got.float()
        if torch.allclose(got, whole, atol=1e-5, rtol=1e-5):
            continue
        real = (l > 0).any(dim=-1)                         # rows (sequence, head) with some key
        if not torch.allclose(got[real], whole[real], atol=1e-5, rtol=1e-5):
            b = int((~torch.isclose(got, whole, atol=1e-5, rtol=1e-5) & real[..., None]).any(-1).any(-1)
                    .nonzero()[0])
            hint = diagnose_merge(got, m, l, acc, real) or (
                "out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s, with M = max_s m_s: compare "
                "the expected and returned rows above")
        else:
            b = int((~real).any(dim=-1).nonzero()[0])
            hint = ("a row with no keys at all (every slice empty, m = -inf) must come back as 0. NaN "
                    "comes from exp(m - M) with M = -inf too: exp(-inf - -inf) = NaN. Take M = 0 when "
                    "every slice is empty, and divide by the total only where it is > 0")
        scores = f", scores near {offset:g}" if offset else ""
        fail(f"merge of {splits} splits over lengths {lens}{scores}: row {b} (length {lens[b]}) differs.\n"
             f"  expected:\n{_show(whole[b, 0])}\n  got:\n{_show(got[b, 0])}\n", hint=hint)
    splits = sorted({n for _, n, _ in MERGE_CASES})
    passed(f"merge_partials: {', '.join(map(str, splits[:-1]))} and {splits[-1]} splits (empty slices included) "
           f"give the unsplit softmax within 1e-5, also with scores near {max(o for *_, o in MERGE_CASES):g}, past "
           f"exp's float32 range; a row with no keys at all gives zeros")


# ---- review questions with a number or a choice for an answer ------------------------------------

def decode_mib(context: int = 4096, layers: int = 28, kv_heads: int = 8, head_dim: int = 128,
               bytes_per_value: int = 2) -> float:
    """MiB of K and V one decode step reads for one sequence (Qwen3-0.6B's shape by default)."""
    return 2 * context * layers * kv_heads * head_dim * bytes_per_value / 2**20


def _answered(answer, question: str, name: str) -> None:
    if answer is None:
        fail(f"{question} is not implemented yet: set {name} in the cell above to your answer "
             "(it is still None)")


@check
def check_answer_decode_bytes(answer) -> None:
    """Q1: MiB of K/V one decode step reads for a 4,096-token sequence in Qwen3-0.6B (fp16)."""
    _answered(answer, "Q1", "q1_mib")
    value, want = answered_number(answer, "Q1", "q1_mib", "a number of MiB"), decode_mib()
    if not abs(value - want) <= 0.01 * want:
        halves = {want / 2: "that is K alone (or V alone): a step reads both",
                  want / 28: "that is one layer: the step runs all 28",
                  want * 2: "fp16 is 2 bytes per value, not 4",
                  want / 4: "count every layer and both K and V"}
        hint = next((h for v, h in halves.items() if abs(value - v) <= 0.01 * v),
                    "2 (K and V) x context x layers x KV heads x head_dim x 2 bytes, divided by 2**20")
        fail("Q1, MiB read per decode step", f"about {want:.0f}", answer, hint)
    passed(f"Q1: {want:.0f} MiB of K/V per decode step for one 4,096-token sequence")


@check
def check_answer_kv_head(answer) -> None:
    """Q2: which KV head does query head 37 of Llama-3-70B (64 query heads, 8 KV heads) read?"""
    _answered(answer, "Q2", "q2_kv_head")
    if answer != 37 // 8:
        hint = ("37 % 8 = 5 spreads neighbouring heads over different KV heads; the group of query "
                "heads sharing a KV head is contiguous" if answer == 37 % 8 else "group = 64 // 8; h // group")
        fail("Q2, the KV head of query head 37", 37 // 8, answer, hint)
    passed("Q2: query head 37 reads KV head 37 // 8 = 4")


@check
def check_answer_loads(answer) -> None:
    """Q3: (loads per key per step by the per-head kernel, by the grouped kernel) for group size 4."""
    _answered(answer, "Q3", "q3_loads")
    got = tuple(answer) if isinstance(answer, (tuple, list)) else answer
    if got != (4, 1):
        fail("Q3, (per-head kernel, grouped kernel) loads of each cached key per step, group 4", (4, 1), got,
             "the per-head kernel runs one program per query head and each loads the whole history; "
             "the grouped kernel loads each tile once for all heads of its group")
    passed("Q3: the per-head kernel reads every key 4 times per step, the grouped kernel once")
