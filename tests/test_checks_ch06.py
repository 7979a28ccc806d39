"""The chapter-6 checks pass on the engine's kernels, say "not implemented yet" on stubs, and name each
classic bug of the primer kernel, the paged decode kernel and the split-K merge in their hints.

The planted kernels are one kernel each with a constexpr BUG switch: `Planted(kernel, n)` launches it
with BUG=n through the same launcher call a learner's kernel gets.
"""
import pytest
import torch

import engine.attention.triton_setup as attention_pkg  # the Triton setup, where its monkeypatches take effect
from engine.checks import ch06
from fixtures.check_support import fails, fails_with, hosted, passes

needs_triton = pytest.mark.skipif(not attention_pkg.triton_installed(), reason="triton is Linux-only")

if attention_pkg.triton_installed():
    triton, tl = attention_pkg.triton_modules()  # TRITON_INTERPRET=1 without CUDA, before any kernel below
    from engine.attention.triton_decode import merge_partials, paged_decode_head_program
    from engine.attention.triton_primer import gather_rows_program

    # What a learner's stubs look like: plain functions (the launchers compile them with triton.jit).
    def stub_kernel(q_ptr, k_pool, v_pool, tables_ptr, lengths_ptr, out_ptr, group, scale,
                    s_qb, s_qh, s_ob, s_oh, s_tb, s_kn, s_kh, s_ks, s_vn, s_vh, s_vs,
                    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
        raise NotImplementedError()

    def stub_gather(x_ptr, index_ptr, out_ptr, rows, cols, s_x, s_out,
                    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
        raise NotImplementedError()

    @triton.jit
    def buggy_gather(x_ptr, index_ptr, out_ptr, rows, cols, s_x, s_out,
                     BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, BUG: tl.constexpr):
        first = tl.program_id(0) * BLOCK_ROWS
        if BUG == 3:                                     # every program writes the first tile
            first = 0
        r = first + tl.arange(0, BLOCK_ROWS)
        c = tl.arange(0, BLOCK_COLS)
        row_ok = r < rows
        if BUG == 4:                                     # no row mask
            row_ok = r >= 0
        col_ok = c < cols
        if BUG == 5:                                     # no column mask
            col_ok = c >= 0
        mask = row_ok[:, None] & col_ok[None, :]
        source = tl.load(index_ptr + r, mask=row_ok, other=0)
        if BUG == 1:                                     # the index ignored
            source = r
        stride = s_x
        if BUG == 2:                                     # rows assumed `cols` apart
            stride = cols
        values = tl.load(x_ptr + source[:, None] * stride + c[None, :], mask=mask)
        if BUG == 6:                                     # the store masked by rows only
            mask = row_ok[:, None]
        tl.store(out_ptr + r[:, None] * s_out + c[None, :], values, mask=mask)

    @triton.jit
    def buggy_decode(q_ptr, k_pool, v_pool, tables_ptr, lengths_ptr, out_ptr, group, scale,
                     s_qb, s_qh, s_ob, s_oh, s_tb, s_kn, s_kh, s_ks, s_vn, s_vh, s_vs,
                     HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                     BUG: tl.constexpr):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // group
        if BUG == 3:                                     # h % Hkv
            kv_head = head % (tl.num_programs(1) // group)
        if BUG == 5:                                     # no 1/sqrt(d)
            scale = 1.0
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + seq * s_qb + head * s_qh + dims).to(tl.float32) * scale
        length = tl.load(lengths_ptr + seq)
        row = tables_ptr + seq * s_tb
        if BUG == 8:                                     # row 0's table for everyone
            row = tables_ptr
        if BUG == 9:                                     # the table's row stride forgotten
            row = tables_ptr + seq
        m = tl.full((), float("-inf"), tl.float32)
        l = tl.zeros((), tl.float32)
        acc = tl.zeros((HEAD_DIM,), tl.float32)
        for start in range(0, length, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            valid = pos < length
            load_ok = valid
            if BUG == 1:                                 # no tail mask anywhere
                valid = pos >= 0
                load_ok = valid
            table_ok = load_ok
            if BUG == 2:                                 # scores and the table masked, K/V loads not
                load_ok = pos >= 0
            if BUG == 11:                                # the block-table load without a mask
                table_ok = pos >= 0
            block = tl.load(row + pos // BLOCK_SIZE, mask=table_ok, other=0)
            if BUG == 4:                                 # logical block as the physical one
                block = pos // BLOCK_SIZE
            slot = pos % BLOCK_SIZE
            k_rows = k_pool + block.to(tl.int64) * s_kn + kv_head * s_kh + slot * s_ks
            v_rows = v_pool + block.to(tl.int64) * s_vn + kv_head * s_vh + slot * s_vs
            kv_mask = load_ok[:, None]
            if BUG == 10:                                # the positions' mask on the dims' axis
                kv_mask = load_ok[None, :]
            k = tl.load(k_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
            v = tl.load(v_rows[:, None] + dims[None, :], mask=load_ok[:, None], other=0.0).to(tl.float32)
            scores = tl.where(valid, tl.sum(k * q[None, :], axis=1), float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=0))
            if BUG == 6:                                 # no max subtracted
                m_new = tl.zeros((), tl.float32)
            alpha = tl.exp(m - m_new)
            if BUG == 6 or BUG == 7:                     # (7: no rescale of l and acc)
                alpha = tl.full((), 1.0, tl.float32)
            p = tl.exp(scores - m_new)
            l = l * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m = m_new
        tl.store(out_ptr + seq * s_ob + head * s_oh + dims, (acc / l).to(out_ptr.dtype.element_ty))


def python_number_starts(q_ptr, k_pool, v_pool, tables_ptr, lengths_ptr, out_ptr, group, scale,
                         s_qb, s_qh, s_ob, s_oh, s_tb, s_kn, s_kh, s_ks, s_vn, s_vh, s_vs,
                         HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Right in the interpreter, refused by a GPU compiler: l and acc start as Python numbers."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * s_qb + head * s_qh + dims).to(tl.float32) * scale
    length = tl.load(lengths_ptr + seq)
    m = float("-inf")
    l, acc = 0, 0.0
    for start in range(0, length, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < length
        block = tl.load(tables_ptr + seq * s_tb + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        slot = pos % BLOCK_SIZE
        k_at = k_pool + block * s_kn + (head // group) * s_kh + slot * s_ks
        v_at = v_pool + block * s_vn + (head // group) * s_vh + slot * s_vs
        k = tl.load(k_at[:, None] + dims[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_at[:, None] + dims[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        scores = tl.where(valid, tl.sum(k * q[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + seq * s_ob + head * s_oh + dims, (acc / l).to(out_ptr.dtype.element_ty))


class Planted(triton.runtime.KernelInterface if attention_pkg.triton_installed() else object):
    """A buggy kernel with its BUG switch set, a Triton kernel like any other: `Planted(k, n)[grid](...)`."""

    def __init__(self, kernel, bug: int):
        self.kernel, self.bug = kernel, bug

    def run(self, *args, grid, warmup, **kwargs):
        return self.kernel[grid](*args, BUG=self.bug, **kwargs)


DECODE_CHECKS = ["check_decode_kernel", "check_decode_garbage", "check_decode_large_scores"]
ALL_DECODE_CHECKS = set(DECODE_CHECKS)


# ---- the references pass, stubs are "not implemented yet" ------------------------------------------

@needs_triton
def test_references_pass():
    passes(ch06.check_gather_rows, gather_rows_program)
    passes(ch06.check_gather_rows, gather_rows_program, seed=3)
    for name in DECODE_CHECKS:
        passes(getattr(ch06, name), paged_decode_head_program)
    passes(ch06.check_merge_partials, merge_partials)


@needs_triton
def test_loop_carried_python_numbers_are_found():
    """The AST scan names values a loop carries that start as Python numbers, and nothing in the reference."""
    assert ch06.loop_carried_numbers(python_number_starts) == [("acc", "0.0"), ("l", "0"), ("m", "float('-inf')")]
    assert ch06.loop_carried_numbers(paged_decode_head_program) == []
    assert ch06.loop_carried_numbers(object()) == []                   # no source: nothing to say


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel is compiled, and refused")
def test_python_number_starts_pass_in_the_interpreter_with_a_warning():
    out = passes(ch06.check_decode_kernel, python_number_starts)
    assert "⚠ your kernel starts acc = 0.0, l = 0, m = float('-inf') as Python numbers" in out
    assert "acc = tl.zeros((HEAD_DIM,), tl.float32)" in out
    assert "⚠" not in passes(ch06.check_decode_kernel, paged_decode_head_program)


@needs_triton
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_python_number_starts_are_refused_on_a_gpu():
    fails_with(ch06.check_decode_kernel, python_number_starts,
               ["does not compile for this GPU", "Loop-carried variable", "acc = tl.zeros((HEAD_DIM,), tl.float32)"])


@needs_triton
def test_engine_milestone_passes_with_the_reference_kernel():
    assert "20 decode steps" in passes(ch06.check_decode_in_engine, paged_decode_head_program)


def test_review_answers():
    ch06.check_answer_decode_bytes(448)
    ch06.check_answer_kv_head(4)
    ch06.check_answer_loads((4, 1))
    assert "K alone" in fails(ch06.check_answer_decode_bytes, 224)
    assert "one layer" in fails(ch06.check_answer_decode_bytes, 16)
    assert "37 % 8" in fails(ch06.check_answer_kv_head, 5)
    assert "once for all heads" in fails(ch06.check_answer_loads, (1, 1))
    for check in (ch06.check_answer_decode_bytes, ch06.check_answer_kv_head, ch06.check_answer_loads):
        assert "not implemented yet" in fails(check, None)


@needs_triton
@pytest.mark.parametrize("name", DECODE_CHECKS + ["check_decode_in_engine"])
def test_stub_kernel_is_not_implemented(name):
    fails_with(getattr(ch06, name), stub_kernel, ["not implemented yet", "stub_kernel"])


@needs_triton
def test_stub_gather_and_merge_are_not_implemented():
    assert "not implemented yet" in fails(ch06.check_gather_rows, stub_gather)

    def merge(m, l, acc):
        raise NotImplementedError()

    assert "not implemented yet" in fails(ch06.check_merge_partials, merge)


# ---- planted bugs: the primer ---------------------------------------------------------------------

@needs_triton
@pytest.mark.parametrize("bug, words", [
    (1, "load index[r] first"),
    (2, "i * s_x"),
    (3, "tl.program_id(0) * BLOCK_ROWS"),
    (4, "past the last row"),
    (5, "mask the columns too"),
    (6, "the store's mask must bound the columns too"),
])
def test_primer_bugs_are_named(bug, words):
    fails_with(ch06.check_gather_rows, Planted(buggy_gather, bug), [words, "expected (the out buffer", "got:"])


class Recorded(triton.runtime.KernelInterface if attention_pkg.triton_installed() else object):
    """A kernel that notes each launch (here, or in the host thread of `hosted`: the same memory)."""

    launches: list = []

    def __init__(self, kernel):
        self.kernel = kernel

    def run(self, *args, grid, warmup, **kwargs):
        Recorded.launches.append(self.kernel)
        return self.kernel[grid](*args, **kwargs)


@pytest.fixture()
def host():
    """The kernels as objects of the grader's host: Remotes, whose where_it_lives helpers the host runs."""
    Recorded.launches.clear()
    with hosted(right=Recorded(triton.jit(gather_rows_program)),
                decode=Recorded(triton.jit(paged_decode_head_program))) as remotes:
        yield remotes


@needs_triton
@pytest.mark.parametrize("check, kernel", [("check_gather_rows", "right"), ("check_decode_kernel", "decode"),
                                           ("check_decode_in_engine", "decode")])
def test_a_kernel_the_graders_host_holds_is_never_launched_and_earns_nothing(host, check, kernel):
    """Issue 36: a launch is never the host's word. A kernel that reaches a check as the host's object (the
    grader's judge builds its own from the cell's text, engine.course.grading.sealed.kernelbox) is not launched,
    neither in the judge nor handed to the host to launch where it lives: the check fails saying why."""
    fails_with(getattr(ch06, check), host[kernel], ["reads from your cell's text", "define it in its exercise cell"])
    assert Recorded.launches == []


def test_no_chapter_6_helper_is_left_for_the_graders_host_to_run():
    from engine.checks import where_it_lives
    runs_there = where_it_lives(lambda: None).__code__
    assert not [name for name, value in vars(ch06).items() if getattr(value, "__code__", None) is runs_there]


# ---- planted bugs: the decode kernel --------------------------------------------------------------

@needs_triton
@pytest.mark.parametrize("bug, words, failing", [
    (1, "slots past the sequence's length", ALL_DECODE_CHECKS),
    (2, "mask the K and V loads too", {"check_decode_garbage"}),
    (3, "not h % Hkv", ALL_DECODE_CHECKS),
    (4, "load the physical id from the block table", ALL_DECODE_CHECKS),
    (5, "scale = 1/sqrt(head_dim)", ALL_DECODE_CHECKS),
    (6, "does not subtract the running max", {"check_decode_large_scores"}),
    (7, "never rescales", ALL_DECODE_CHECKS),
    (8, "every sequence reads row 0", ALL_DECODE_CHECKS),
    (9, "not tables_ptr + b", ALL_DECODE_CHECKS),
    (11, "the block-table load has no mask", {"check_decode_kernel", "check_decode_garbage"}),
])
def test_decode_bugs_are_named(bug, words, failing):
    kernel = Planted(buggy_decode, bug)
    for name in DECODE_CHECKS:
        if name in failing:
            fails_with(getattr(ch06, name), kernel, [words])
        else:
            passes(getattr(ch06, name), kernel)


@needs_triton
def test_a_shape_error_names_the_kernels_line_and_the_sizes():
    """K/V loads masked on the wrong axis crash in the interpreter: the message is the kernel's line, not the
    launcher's, with the two sizes that did not match."""
    message = fails_with(ch06.check_decode_kernel, Planted(buggy_decode, 10), [
        "your kernel crashed in buggy_decode", "mask=kv_mask", "different sizes on axis 1", "valid[:, None]"])
    assert "paged_decode_per_head" not in message


@needs_triton
def test_engine_milestone_catches_a_planted_bug():
    fails_with(ch06.check_decode_in_engine, Planted(buggy_decode, 4), ["the logits differ from a from-scratch run",
                                                                        "decode through your kernel"])


# ---- planted bugs: split-K's merge ----------------------------------------------------------------

def top(m):
    """The largest m_s of each row, 0 where every slice is empty (what a right merge subtracts)."""
    best = m.amax(-1, keepdim=True)
    return torch.where(best == float("-inf"), torch.zeros_like(best), best)


def merge_without_weights(m, l, acc):
    return acc.sum(-2) / l.sum(-1, keepdim=True)


def merge_with_unweighted_l(m, l, acc):                # the denominator not rescaled by exp(m_s - M)
    weight = torch.exp(m - top(m))
    return (weight[..., None] * acc).sum(-2) / l.sum(-1, keepdim=True).clamp(min=1e-30)


def merge_with_unweighted_acc(m, l, acc):              # the numerator not rescaled
    weight = torch.exp(m - top(m))
    total = (weight * l).sum(-1, keepdim=True)
    return acc.sum(-2) / torch.where(total > 0, total, torch.ones_like(total))


def merge_by_averaging(m, l, acc):
    share = acc / l[..., None]
    share = torch.where(l[..., None] > 0, share, torch.zeros_like(share))
    return share.sum(-2) / (l > 0).sum(-1, keepdim=True).clamp(min=1)


def merge_weighting_acc_by_l(m, l, acc):               # acc treated as if it were normalized
    weight = torch.exp(m - top(m))
    total = (weight * l).sum(-1, keepdim=True)
    return (weight[..., None] * l[..., None] * acc).sum(-2) / torch.where(total > 0, total, torch.ones_like(total))


def merge_with_inverted_weights(m, l, acc):
    weight = torch.exp(top(m) - m)
    return (weight[..., None] * acc).sum(-2) / (weight * l).sum(-1, keepdim=True)


def merge_without_division(m, l, acc):
    return (torch.exp(m - top(m))[..., None] * acc).sum(-2)


def merge_without_max(m, l, acc):                      # exp(m_s): fine until a max passes ~88
    weight = torch.exp(m)
    total = (weight * l).sum(-1, keepdim=True)
    return (weight[..., None] * acc).sum(-2) / torch.where(total > 0, total, torch.ones_like(total))


def merge_against_the_min(m, l, acc):
    weight = torch.exp(m - m.amin(-1, keepdim=True))
    return (weight[..., None] * acc).sum(-2) / (weight * l).sum(-1, keepdim=True)


def merge_max_over_heads(m, l, acc):                   # M over the wrong axis of m [B, H, S]
    best = m.amax(-2, keepdim=True)
    weight = torch.exp(m - torch.where(best == float("-inf"), torch.zeros_like(best), best))
    total = (weight * l).sum(-1, keepdim=True)
    return (weight[..., None] * acc).sum(-2) / torch.where(total > 0, total, torch.ones_like(total))


def merge_nan_on_empty(m, l, acc):
    weight = torch.exp(m - m.amax(-1, keepdim=True))
    return (weight[..., None] * acc).sum(-2) / (weight * l).sum(-1, keepdim=True)


@pytest.mark.parametrize("merge, words", [
    (merge_without_weights, "weight them by exp(m_s - M)"),
    (merge_with_unweighted_l, "the denominator adds the slices' l_s as they are"),
    (merge_with_unweighted_acc, "the numerator adds the slices' acc_s as they are"),
    (merge_by_averaging, "averaging the slices' normalized outputs"),
    (merge_weighting_acc_by_l, "not by exp(m_s - M) * l_s"),
    (merge_with_inverted_weights, "upside down"),
    (merge_without_division, "divide it by the weighted sum of the l_s"),
    (merge_without_max, "without subtracting the largest max M"),
    (merge_against_the_min, "M must be the largest m_s"),
    (merge_max_over_heads, "a max over the wrong axis"),
    (merge_nan_on_empty, "exp(-inf - -inf) = NaN"),
])
def test_merge_bugs_are_named(merge, words):
    """Each wrong weighting of l or of acc, each wrong max, a missing division: the hint names that one."""
    message = fails(ch06.check_merge_partials, merge)
    assert words in message and "expected:" in message and "got:" in message


def test_every_merge_hint_is_reachable():
    """No hint in the check's table is shadowed by an earlier one: each planted merge above gets its own."""
    hints = {fails(ch06.check_merge_partials, merge).split("Hint: ", 1)[1] for merge in (
        merge_without_weights, merge_with_unweighted_l, merge_with_unweighted_acc, merge_by_averaging,
        merge_weighting_acc_by_l, merge_with_inverted_weights, merge_without_division, merge_without_max,
        merge_against_the_min, merge_max_over_heads)}
    assert len(hints) == len(ch06.MERGE_BUGS) == 10


def test_merge_check_runs_without_triton(monkeypatch):
    """The merge is torch: it is graded on macOS too, while a kernel check says why it cannot run."""
    monkeypatch.setattr(ch06, "triton_installed", lambda: False)
    ch06.check_merge_partials(lambda m, l, acc: _reference_merge(m, l, acc))
    assert "Triton is not available on this platform" in fails(ch06.check_decode_kernel, object())
    assert "Triton is not available on this platform" in fails(ch06.check_gather_rows, object())


def _reference_merge(m, l, acc):
    top = m.amax(-1, keepdim=True)
    top = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    weight = torch.exp(m - top)
    total = (weight * l).sum(-1, keepdim=True)
    return (weight[..., None] * acc).sum(-2) / torch.where(total > 0, total, torch.ones_like(total))


def test_stand_ins_define_kernels_without_triton(monkeypatch):
    """Without Triton (macOS, Windows), @triton.jit and tl.constexpr still define a kernel; launching it says why."""
    monkeypatch.setattr(attention_pkg, "triton_installed", lambda: False)
    fake_triton, fake_tl = attention_pkg.triton_modules()

    @fake_triton.jit
    def kernel(x_ptr, BLOCK: fake_tl.constexpr):
        x = fake_tl.arange(0, BLOCK)
        return x

    with pytest.raises(attention_pkg.TritonUnavailable, match="Linux wheels only"):
        kernel[(1,)](None, BLOCK=4)
