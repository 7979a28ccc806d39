"""The smallest Triton kernel worth checking: gather rows of a matrix through an index vector.

`out[r, :] = x[index[r], :]` is the paged read in miniature: an indirection (the index plays the
block table), a 2-D tile of pointers built from program ids, and masks for the edges that do not
fill a tile. Chapter 6 starts here: the learner writes `gather_rows_program`, and `gather_rows`
launches the kernel, or the learner's function compiled the same way.
"""

from __future__ import annotations

import torch

from engine.attention.triton_setup import prepare_triton

INTERPRETED = prepare_triton()  # before `import triton`: kernels are interpreted or compiled when defined

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def gather_rows_program(x_ptr, index_ptr, out_ptr, rows, cols, s_x, s_out,
                        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """Grid (cdiv(rows, BLOCK_ROWS),): program i writes out's rows from i*BLOCK_ROWS on.

    out[r, c] = x[index[r], c] for r < rows, c < cols. Row j of x starts at x_ptr +
    j * s_x, row r of out at out_ptr + r * s_out; within a row values are contiguous.
    Nothing outside out[:rows, :cols] is written, and no index past rows is used.
    """
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # my rows of out
    c = tl.arange(0, BLOCK_COLS)
    row_ok = r < rows
    mask = row_ok[:, None] & (c[None, :] < cols)
    source = tl.load(index_ptr + r, mask=row_ok, other=0)          # rows of x to read
    values = tl.load(x_ptr + source[:, None] * s_x + c[None, :], mask=mask)
    tl.store(out_ptr + r[:, None] * s_out + c[None, :], values, mask=mask)


gather_rows_kernel = triton.jit(gather_rows_program)  # what @triton.jit above it would make


def gather_rows(x: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None, kernel=None,
                block_rows: int = 4) -> torch.Tensor:
    """x[index] for a 2-D x with contiguous rows, through `gather_rows_kernel` or `kernel` (a
    kernel, or a function with its signature to compile with triton.jit).

    Writes into `out` when given (any [len(index), x.shape[1]] view with contiguous rows) and returns it.
    """
    if x.ndim != 2 or index.ndim != 1 or x.stride(1) != 1:
        raise ValueError(f"x must be 2-D with contiguous rows and index 1-D, got {tuple(x.shape)}, "
                         f"{tuple(index.shape)}")
    rows, cols = index.shape[0], x.shape[1]
    out = torch.empty(rows, cols, dtype=x.dtype, device=x.device) if out is None else out
    if tuple(out.shape) != (rows, cols) or out.stride(1) != 1:
        raise ValueError(f"out must be [{rows}, {cols}] with contiguous rows, got {tuple(out.shape)}")
    grid = (triton.cdiv(rows, block_rows),)
    from engine.attention.triton_decode import as_kernel
    as_kernel(kernel or gather_rows_kernel)[grid](x, index.contiguous(), out, rows, cols, x.stride(0),
                                                  out.stride(0), BLOCK_ROWS=block_rows,
                                                  BLOCK_COLS=triton.next_power_of_2(cols))
    return out
