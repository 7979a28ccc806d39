"""The grader's threads parse one at a time: CPython 3.11 keeps the AST constructor's recursion count in
one place for the whole interpreter, and two threads parsing at once while a garbage collection runs a
finalizer (which hands the interpreter to the other thread) fail with "SystemError: AST constructor
recursion depth mismatch" (python/cpython#106905; it once failed tests/test_grade_busy.py on a busy
machine). Here the race is provoked for a few seconds: without the lock it fails about once in ten
seconds on CPython 3.11.7, with it never.
"""
import ast
import gc
import sys
import threading
import time

import engine.course.grading.kernel as kernel

STOP = threading.Event()                  # set once the race has run: finalizers then stop yielding
SOURCE = "\n".join(f"def f{i}(a, b):\n    return [x + {i} for x in (a, b) if x]" for i in range(300))


class _Finalized:
    def __init__(self):
        self.me = self                    # a cycle: only the garbage collector frees it, running __del__

    def __del__(self):
        if not STOP.is_set():             # the interpreter may go to another thread here; after the race,
            time.sleep(0)                 # each such hand-over at 5 ms switching cost minutes of joins


def test_parsing_in_threads_while_finalizers_run_never_fails():
    kernel.parse_one_at_a_time()
    assert getattr(ast.parse, "_one_at_a_time", False)
    errors, stop = [], STOP
    stop.clear()

    def parse():
        while not stop.is_set():
            try:
                ast.parse(SOURCE)
            except SystemError as error:
                errors.append(str(error))

    def garbage():
        while not stop.is_set():
            for _ in range(200):
                _Finalized()
            time.sleep(0)

    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(5)
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=parse) for _ in range(3)] + [threading.Thread(target=garbage)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(4)
    finally:
        stop.set()
        gc.set_threshold(*threshold)      # before the joins: at a microsecond's switching, finishing the
        sys.setswitchinterval(interval)   # parses in flight took minutes on a busy machine
        for thread in threads:
            thread.join()
    assert errors == []


def test_the_lock_is_taken_once():
    kernel.parse_one_at_a_time()
    first = ast.parse
    kernel.parse_one_at_a_time()
    assert ast.parse is first and ast.parse("x = 1").body[0].targets[0].id == "x"
