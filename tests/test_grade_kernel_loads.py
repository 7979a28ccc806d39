"""The kernel process watches a kernel's loads as the lab's check does, and the grader launches no kernel
the host holds (issues 38 and 36).

In the lab, chapter 6's decode checks watch the interpreter's loads, and a kernel that loads block-table
entries past a row's last block fails with UNMASKED_TABLE, though its output is right (the loaded ids
feed only masked K/V loads, so no poison in the table can reach the output: only the loads show it).
Under the grader the kernel runs in the kernel process (engine.course.grading.sealed.kernelbox): a check asks that
process for the bytes a launch loaded of the table, exactly that many bytes more in the reply, and decides
from them. That report is the kernel process's word, so it can only fail a kernel: the reference passes.
"""
import inspect
import json
import sys

import pytest
import torch

import engine.attention.triton_setup as attention_pkg
from engine.checks import CheckFailed, ch06
from fixtures.check_support import fails, passes

needs_triton = pytest.mark.skipif(not attention_pkg.triton_installed(), reason="triton is Linux-only")

if attention_pkg.triton_installed():
    triton, tl = attention_pkg.triton_modules()  # TRITON_INTERPRET=1 without CUDA: the lab's own watch
    from engine.attention.triton_decode import as_kernel, paged_decode_head_program
    from engine.attention.triton_primer import gather_rows_program
    from engine.course.grading.kernel import kernel_argv
    from engine.course.grading.sealed.kernelbox import KernelBox, KernelProcessError, from_cell, sandboxed_kernel

    DECODE = inspect.getsource(paged_decode_head_program)
    GATHER = inspect.getsource(gather_rows_program)


def planted(source: str, old: str, new: str) -> str:
    """A planted bug as a small edit of the reference's text (found exactly once)."""
    assert source.count(old) == 1, old
    return source.replace(old, new)


UNMASKED_LOAD = ("tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0)", "tl.load(table + pos // BLOCK_SIZE)")
DECODE_CHECKS = ("check_decode_kernel", "check_decode_garbage", "check_decode_large_scores")
CAUGHT = {"check_decode_kernel", "check_decode_garbage"}    # the large-score cases' tiles end at a row's end
PARTIAL = '''
def partial(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < 3, other=0.0))
'''


@pytest.fixture(scope="module")
def box():
    made = KernelBox(kernel_argv())
    yield made
    made.stop()


def in_the_kernel_process(box, name: str, text: str):
    """The learner's kernel as the grader's checks get it: built from the text, launched in `box`."""
    program, why = from_cell(name, text)
    assert why == "", why
    return sandboxed_kernel(box, program)


def in_the_lab(name: str, text: str):
    """The same text as a plain function of this process, as a learner's cell defines it in the lab."""
    program, _ = from_cell(name, text)
    namespace = {"tl": tl, "triton": triton, **program.constants}
    exec(compile(program.text, program.filename, "exec"), namespace)
    return namespace[name]


@needs_triton
def test_the_kernel_process_reports_which_bytes_a_launch_loaded_of_a_watched_tensor(box):
    kernel = in_the_kernel_process(box, "partial", PARTIAL)
    x, out = torch.arange(8.0), torch.zeros(4)
    with kernel.loads_of(x) as loads:
        as_kernel(kernel)[(1,)](x[2:6], out, N=4)
    assert out.tolist() == [2.0, 3.0, 4.0, 0.0]
    first = [False, False, True, True, True, False, False, False]     # x[5] was masked off: not read
    assert loads.read().tolist() == first
    as_kernel(kernel)[(1,)](x[4:8], out, N=4)                    # no watch: no more bytes asked, none counted
    assert out.tolist() == [4.0, 5.0, 6.0, 0.0] and loads.read().tolist() == first


FAKE_KERNEL_PROCESS = '''
import json, os, struct, sys
H = struct.Struct("!QQ")
out = os.fdopen(1, "wb", buffering=0)
def send(header, blob=b""):
    body = json.dumps(header).encode()
    out.write(H.pack(len(body), len(blob)) + body + blob)
send({"ready": True})
inp = os.fdopen(0, "rb", buffering=0)
def read(n):
    data = b""
    while len(data) < n:
        data += inp.read(n - len(data))
    return data
j, b = H.unpack(read(H.size))
request = json.loads(read(j))
blob = read(b)
with open(sys.argv[1], "w") as seen:
    json.dump(request["watch"], seen)
send({"ok": True}, blob)          # the storages back, without the bytes of the watched one
'''


@needs_triton
def test_a_reply_without_the_watched_bytes_is_refused(tmp_path):
    """The judge asked for the storages and the watched storage's marks: a reply of the storages alone
    (a kernel process that hides what it loaded) is not what was asked, and fails the launch."""
    seen = tmp_path / "watch.json"
    fake = KernelBox([sys.executable, "-c", FAKE_KERNEL_PROCESS, str(seen)])
    kernel = sandboxed_kernel(fake, from_cell("partial", PARTIAL)[0])
    try:
        x = torch.arange(8.0)
        with kernel.loads_of(x), pytest.raises(KernelProcessError, match="exactly the 80 bytes"):
            as_kernel(kernel)[(1,)](x, torch.zeros(4), N=4)
    finally:
        fake.stop()
    assert json.loads(seen.read_text()) == [0]


@needs_triton
def test_an_unmasked_table_load_fails_in_the_kernel_process_as_in_the_lab(box):
    """Same text, same checks, same messages: in the lab (this process's interpreter, watched by the check)
    and in the kernel process (watched there, decided here); the reference passes in both."""
    text = planted(DECODE, *UNMASKED_LOAD)
    lab, graded = in_the_lab("paged_decode_head_program", text), in_the_kernel_process(
        box, "paged_decode_head_program", text)
    for name in DECODE_CHECKS:
        check = getattr(ch06, name)
        if name in CAUGHT:
            message = fails(check, graded)
            assert message == fails(check, lab), name
            assert "read block-table entries past a row's last block" in message and ch06.UNMASKED_TABLE in message
        else:
            passes(check, lab)
            passes(check, graded)
    reference = in_the_kernel_process(box, "paged_decode_head_program", DECODE)
    for name in DECODE_CHECKS:
        passes(getattr(ch06, name), reference)


@needs_triton
def test_writes_outside_out_and_a_shape_error_are_named_through_the_kernel_process(box):
    """What the removed host launch showed, through the kernel process: a store masked by rows only writes
    right of out's columns (the whole storage comes back), and a crash quotes the kernel's own line."""
    passes(ch06.check_gather_rows, in_the_kernel_process(box, "gather_rows_program", GATHER))
    rows_only = planted(GATHER, "c[None, :], values, mask=mask)", "c[None, :], values, mask=row_ok[:, None])")
    message = fails(ch06.check_gather_rows, in_the_kernel_process(box, "gather_rows_program", rows_only))
    assert "the store's mask must bound the columns too" in message, message
    wrong_axis = planted(DECODE, "mask=tile, other=0.0).to(tl.float32)\n        v",
                         "mask=valid[None, :], other=0.0).to(tl.float32)\n        v")
    message = fails(ch06.check_decode_kernel, in_the_kernel_process(box, "paged_decode_head_program", wrong_axis))
    for words in ("your kernel crashed in paged_decode_head_program", "mask=valid[None, :]", "valid[:, None]"):
        assert words in message, message


@needs_triton
def test_a_check_never_asks_the_learners_object_about_its_loads():
    """Whether a kernel reports its loads is read off the judge's own class, never asked of the object (a
    Remote's attribute is a request to the host)."""
    class Asked:
        def __getattr__(self, name):
            raise AssertionError(f"asked for {name}")
    with pytest.raises(CheckFailed):
        with ch06._table_reads_past_rows(Asked(), torch.zeros(2, 3, dtype=torch.long), ch06.decode_case([1, 2], 1)):
            raise CheckFailed("launched")


# ---- through the sealed grader: make grade and make autograde ----------------------------------------

def _graded(tag: str, unmasked: bool, sandboxed: bool):
    from engine.course.grading.grade import grade_notebook, sandboxed_grade
    from fixtures.course_support import BUILD, REPO, expanded, with_solution, write_notebook
    chapter = REPO / "solutions" / "ch06_triton_decode.py"
    notebook = expanded(chapter)
    if unmasked:
        [cell] = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ch06_decode_kernel"]
        notebook = with_solution(notebook, "ch06_decode_kernel", planted(cell.source, *UNMASKED_LOAD))
    path = write_notebook(notebook, BUILD / "kernels" / tag, chapter.stem)
    return (sandboxed_grade if sandboxed else grade_notebook)(path, chapter, 120)


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("sandboxed", [False, True], ids=["make-grade", "make-autograde"])
def test_the_sealed_grader_takes_exactly_the_labs_points_for_an_unmasked_table_load(sandboxed):
    """Issue 38: the solution with the block-table load unmasked scored 20/20 under the sealed grader; it now
    loses the two tests the lab's checks fail (6 points), each with the lab's hint, and nothing else."""
    if sandboxed:
        from fixtures.course_support import sandbox_or_skip
        sandbox_or_skip()
    grade = _graded("unmasked_table_" + ("sandboxed" if sandboxed else "plain"), True, sandboxed)
    lost = {e.grade_id: e.message for e in grade.exercises if e.kind == "test" and e.earned != e.possible}
    assert set(lost) == {"ch06_test_decode_kernel", "ch06_test_decode_garbage"}, lost
    for message in lost.values():
        assert "read block-table entries past a row's last block" in message and ch06.UNMASKED_TABLE in message
    assert (grade.earned, grade.possible) == (14, 20), (grade.earned, grade.possible)


@pytest.mark.slow
@needs_triton
def test_the_solution_keeps_every_point_under_the_sealed_grader():
    grade = _graded("solution_watched", False, False)
    assert [e.grade_id for e in grade.exercises if e.kind == "test" and e.earned != e.possible] == []
    assert grade.earned == 20
