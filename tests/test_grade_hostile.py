"""A hostile host: the learner owns the process that runs the notebook, so every byte it sends may be wrong.

The real judge and grader (engine.course.grading.kernel.SealedKernel) are joined to a scripted host that answers
the first request of one kind with a wrong shape (extra names, wrong types, a flood, out of turn, never,
forged exceptions, handles that do not exist) and every later request honestly. Each costs only the
test it answered, runs nothing in the judge, and the next test, and the next notebook, start clean.
"""
import sys

from engine.course.grading.kernel import SealedKernel
from fixtures.course_support import REPO

# The host, scripted: the honest part answers as engine.course.grading.sealed.host does (a plain namespace);
# every other test's `lookup` (for "fake_not_written", the call of `answer` after it) is the next scenario's.
HOSTILE = r'''
import json, socket, struct, sys, time
sys.path.insert(0, REPO)
from engine.course.grading.sealed.remote import Channel
channel = Channel(socket.socket(fileno=int(sys.argv[2])), "L")
plan = channel._receive()["plan"]
namespace = {}
import os


def next_scenario():
    """Across restarts of the host (a file in its folder): even lookups are a scenario's, odd ones honest."""
    step = int(open("step").read()) if os.path.exists("step") else 0
    open("step", "w").write(str(step + 1))
    return SCRIPT[step // 2] if step % 2 == 0 and step // 2 < len(SCRIPT) else "honest"


SCRIPT = [name for name in sys.argv[1].split(",") if name]
pending_call = False


def raw(message):
    body = json.dumps(message).encode()
    channel.sock.sendall(struct.pack("!Q", len(body)) + body)


def forged_error(module, name, mro, qualname=None):
    return {"~": "error", "c": [module, name], "args": ["forged"], "message": "forged", "where": [],
            "mro": mro, "attrs": {"qualname": qualname} if qualname else {}}


LOOKUP = {
    "extra_names": lambda call, names: {"reply": call, "value": channel.encode(
        dict({n: namespace[n] for n in names if n in namespace}, AssertionError=None, check=print))},
    "not_a_mapping": lambda call, names: {"reply": call, "value": channel.encode([42, 42])},
    "wrong_key_type": lambda call, names: {"reply": call, "value": {"~": "dict", "v": [[5, 42]]}},
    "untagged": lambda call, names: {"reply": call, "value": [1, 2, 3]},
    "many_values": lambda call, names: {"reply": call, "value": channel.encode({"answer": list(range(1_200_000))})},
    "no_such_handle": lambda call, names: {"reply": call, "value": {"~": "dict", "v": [
        ["answer", {"~": "ref", "owner": "T", "id": 12345}]]}},
    "forged_method": lambda call, names: {"reply": call, "value": {"~": "dict", "v": [
        ["answer", {"~": "method", "owner": "L", "id": 12345, "name": "swap_out"}]]}},
    "class_by_name": lambda call, names: {"reply": call, "value": {"~": "dict", "v": [
        ["answer", {"~": "class", "c": ["builtins", "exec"]}]]}},
    "tensor_past_its_bytes": lambda call, names: {"reply": call, "value": {"~": "dict", "v": [
        ["answer", {"~": "tensor", "dtype": "float32", "shape": [1 << 40], "device": "cpu", "data": "AAAA"}]]}},
    "frozen_object": lambda call, names: {"reply": call, "value": {"~": "dict", "v": [
        ["answer", {"~": "frozen", "c": ["builtins", "object"], "v": {}}]]}},
    # an engine dataclass with a field of its own: the answer's "method" shadowing its class's
    "frozen_extra_field": lambda call, names: {"reply": call, "value": {"~": "dict", "v": [
        ["answer", {"~": "frozen", "c": ["engine.sampling", "SamplingParams"], "v": {
            "temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_tokens": 16, "seed": None, "ignore_eos": False,
            "__eq__": 42}}]]}},
    "stopping_exception": lambda call, names: {"reply": call, "error": forged_error(
        "engine.course.grading.sealed.remote", "RemoteGone",
        [["builtins", "SystemExit"], ["builtins", "KeyboardInterrupt"]])},
    "out_of_turn": lambda call, names: {"reply": call + 7, "value": None},
    # a request of its own, instead of the reply: the judge serves none, whatever it names
    "asks_the_judge": lambda call, names: {"call": 1, "op": "call_engine", "target": None, "kwargs": channel.encode({}),
                                           "args": channel.encode(["os", "system", "id"])},
    "calls_a_judge_object": lambda call, names: {"call": 2, "op": "getattr", "target": 12345,
                                                 "kwargs": channel.encode({}), "args": channel.encode(["__globals__"])},
    "looks_up_the_judges_names": lambda call, names: {"call": 3, "op": "lookup", "target": None,
                                                      "args": channel.encode([["fail", "key"]]),
                                                      "kwargs": channel.encode({})},
}


def serve(op, target, args, kwargs):
    if op == "cell":
        try:
            exec(args[0], namespace)
            return {"status": "ok", "outputs": []}
        except Exception as error:
            return {"status": "error", "outputs": []}
    if op == "lookup":
        return {n: namespace[n] for n in args[0] if n in namespace}
    if op == "begin_test":
        return {}
    if op == "end_test":
        return {}
    raise ValueError(op)


channel.serve = serve
channel._send({"ready": True})
while True:
    message = channel._receive()
    op = message.get("op")
    scenario = next_scenario() if op == "lookup" else "honest"
    if scenario == "huge_frame":
        channel.sock.sendall(struct.pack("!Q", 1 << 40))
        continue
    if scenario == "never":
        time.sleep(3600)
    if scenario in LOOKUP:
        raw(LOOKUP[scenario](message["call"], channel.decode(message["args"])[0]))
        continue
    if op == "call" and pending_call:
        pending_call = False
        raw({"reply": message["call"], "error": forged_error("engine._edition", "NotWrittenYet", [
            ["engine._edition", "NotWrittenYet"], ["builtins", "NotImplementedError"]], "answer")})
        continue
    if op == "lookup":
        pending_call = scenario == "fake_not_written"
    channel.answer(message)
'''

LEARNER = "def answer():\n    return 42\n"
TEST = "from engine.checks import served\nwith served('the answer'):\n    assert answer() == 42\n"
PLAN = {"preimport": ["engine", "engine.sampling"], "graded": {"answer": {}}, "graded_by_cell": {}, "judge_cells": [],
        "references": [["engine.checks", "answer"]]}
# scenario -> what the failed test says (the bound or the wrong shape, named)
SCENARIOS = {"extra_names": "names it did not ask for ('AssertionError', 'check')",
             "not_a_mapping": "with a list, not the names asked for",
             "wrong_key_type": "names it did not ask for (5)",
             "untagged": "an untagged list", "many_values": "more than 1,000,000 values",
             "huge_frame": "the grader's bound is", "no_such_handle": "never sent",
             "forged_method": "holds no reference to", "tensor_past_its_bytes": "do not fit it",
             "class_by_name": "an unknown value",
             "frozen_object": "unknown frozen dataclass", "frozen_extra_field": "are not its class's",
             "stopping_exception": "forged",
             "out_of_turn": "out of turn", "never": "took more than", "fake_not_written": "forged",
             "asks_the_judge": "the grader answers none", "calls_a_judge_object": "the grader answers none",
             "looks_up_the_judges_names": "the grader answers none"}


class HostileKernel(SealedKernel):
    """The real grader and judge, with the scripted host in place of engine.course.grading.sealed.host."""

    script = ""

    def _host_command(self, code: str, *arguments: str) -> list[str]:
        return [sys.executable, "-c", HOSTILE.replace("REPO", repr(str(REPO))), self.script, *arguments]


def _notebook(kernel, tests: int, timeout: float) -> list[tuple[str, str]]:
    """The learner's cell, then the test `tests` times, restarting and replaying as grade.py does."""
    results = []
    kernel.run_cell(LEARNER, "learner", "ch98_answer", timeout)
    for _ in range(tests):
        run = kernel.run_cell(TEST, "test", "ch98_test_answer", timeout)
        results.append((run.status, " ".join(str(o.get("evalue", o.get("text", ""))) for o in run.outputs)))
        if not run.usable:
            kernel.restart()
            kernel.run_cell(LEARNER, "learner", "ch98_answer", timeout)
    return results


def test_each_wrong_answer_costs_only_its_own_test_and_says_what_was_wrong(tmp_path):
    """One notebook: the test after each wrong answer is answered honestly and earns its points; the
    next notebook (another submission, on the same warm judge) is not touched."""
    HostileKernel.script = ",".join(SCENARIOS)
    with HostileKernel(dict(PLAN), cwd=tmp_path) as kernel:
        results = _notebook(kernel, 2 * len(SCENARIOS), 2)
        assert not kernel.tampered_channel
    for (scenario, message), (wrong, honest) in zip(SCENARIOS.items(), zip(results[::2], results[1::2])):
        assert wrong[0] != "ok" and message in wrong[1], (scenario, wrong)
        assert honest[0] == "ok", (scenario, honest)
    HostileKernel.script = ""
    (tmp_path / "next").mkdir()
    with HostileKernel(dict(PLAN), cwd=tmp_path / "next") as kernel:
        assert [status for status, _ in _notebook(kernel, 2, 20)] == ["ok", "ok"]
