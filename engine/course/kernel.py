"""A Jupyter kernel that runs one cell at a time and survives what a learner's code can do to it.

`run` never hangs and never raises for the learner's sake: an error comes back as the cell's outputs,
a cell past its timeout is interrupted (and reported as a CellTimeoutError output, as nbgrader does),
and a kernel that died (os._exit, a segfault) or ignores the interrupt is reported so the caller can
`restart` it and replay what the later cells need.
"""
from __future__ import annotations

import queue
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client import KernelManager
from nbformat import NotebookNode
from nbformat.v4 import output_from_msg

OUTPUT_MESSAGES = {"stream", "display_data", "execute_result", "error"}
INTERRUPT_GRACE_S = 5.0  # how long an interrupted cell may take to stop before the kernel is restarted


@dataclass
class CellRun:
    """What running one cell did. status: ok | error | timeout | dead; usable: the kernel still works."""

    status: str
    outputs: list = field(default_factory=list)
    usable: bool = True


class Kernel:
    """One kernel process (the venv's python3 by default), started in `cwd` with `env`."""

    def __init__(self, kernel_name: str = "python3", cwd: Path | None = None, env: dict | None = None,
                 startup_timeout: float = 120):
        self.manager = KernelManager(kernel_name=kernel_name)
        self.cwd, self.env, self.startup_timeout = cwd, env, startup_timeout
        self.client = None

    def __enter__(self) -> "Kernel":
        # The kernel's own stdout/stderr (not the cells': those come as messages) would only add noise.
        self.manager.start_kernel(cwd=str(self.cwd) if self.cwd else None, env=self.env,
                                  extra_arguments=["--HistoryManager.hist_file=:memory:"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._connect()
        return self

    def __exit__(self, *exc) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)

    def _connect(self) -> None:
        """A fresh client on the (re)started kernel, ready for requests."""
        if self.client is not None:
            self.client.stop_channels()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=self.startup_timeout)

    def restart(self) -> None:
        """A fresh kernel process: everything the notebook defined is gone."""
        self.manager.restart_kernel(now=True)
        self._connect()

    def run(self, code: str, timeout: float) -> CellRun:
        """Run `code`, collecting its outputs, for at most `timeout` seconds."""
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        outputs: list = []
        deadline = time.monotonic() + timeout
        while True:
            state = self._collect(msg_id, outputs, deadline)
            if state == "idle":
                return CellRun(self._reply_status(msg_id), outputs)
            if state == "dead":
                outputs.append(_error("DeadKernelError", "the kernel died while running this cell "
                                      "(for example os._exit or a crash); it was restarted"))
                return CellRun("dead", outputs, usable=False)
            # timeout: interrupt, and give the cell a moment to stop
            self.manager.interrupt_kernel()
            stopped = self._collect(msg_id, [], time.monotonic() + INTERRUPT_GRACE_S) == "idle"
            if stopped:
                self._reply_status(msg_id)
            outputs.append(_error("CellTimeoutError", f"the cell ran longer than {timeout:g} s and was stopped"
                                  + ("" if stopped else "; the kernel did not respond and was restarted")))
            return CellRun("timeout", outputs, usable=stopped)

    def _collect(self, msg_id: str, outputs: list, deadline: float) -> str:
        """Gather the cell's outputs until it is idle, the kernel dies, or the deadline passes."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            try:
                message = self.client.get_iopub_msg(timeout=min(0.2, remaining))
            except queue.Empty:
                if not self.manager.is_alive():
                    return "dead"
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "status" and content["execution_state"] == "idle":
                return "idle"
            if kind == "clear_output":
                outputs.clear()
            elif kind in OUTPUT_MESSAGES:
                outputs.append(output_from_msg(message))

    def _reply_status(self, msg_id: str) -> str:
        """ok or error, from the execute reply on the shell channel."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                reply = self.client.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return "ok" if reply["content"]["status"] == "ok" else "error"
        return "error"


def _error(ename: str, evalue: str) -> NotebookNode:
    """An error output, as the kernel would have written it."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])
