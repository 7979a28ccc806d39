"""`make autograde CLUSTER=tcp://host:8786`: each submission one task on a Dask cluster's workers.

The coordinator (the machine that holds the course folder) sends each worker a submission's bytes, its
chapter's text and a key made for that task alone; the worker runs the same sealed, sandboxed grader as
one machine does (engine/course/grading/cluster_task.py) and returns the result under that key's HMAC. Only
the coordinator writes results, after checking the HMAC, the submission named (student, chapter,
notebook sha256) and the grader's settings; a result that fails is refused and graded again.

Faults: the scheduler is told to give up on a task at the first worker that dies running it; the
coordinator then sends it once more, to another worker, and a submission that stopped both is reported
"not graded: it stopped 2 workers" while the class goes on. The scheduler going away stops the run
with a message; every result accepted so far is in the course folder, so a rerun grades only the rest.
"""
from __future__ import annotations

import hmac
import secrets
import sys
import time
from collections import Counter, deque
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from pathlib import Path

CONNECT_SECONDS = 20      # to reach the scheduler, and for it to have a worker
ATTEMPTS = 2              # a submission whose worker died is sent once more, to another worker


@dataclass
class Job:
    """One submission to grade: where it is in the course folder and what its result must name."""

    path: Path            # course/submitted/<id>/<chNN>/<chNN_topic>.ipynb
    chapter: Path
    grader: dict          # cluster_task.settings(): what the result must have been graded under
    student: str = ""
    assignment: str = ""

    def __post_init__(self):
        self.student, self.assignment = self.path.parent.parent.name, self.path.parent.name


@dataclass
class Tally:
    """What a grading run did, for the progress lines and the final summary."""

    total: int
    progress: object = print
    done: int = 0
    kept: int = 0                                     # authentic results of an earlier run, reused
    where: Counter = field(default_factory=Counter)   # worker (or "this machine") -> submissions graded
    again: int = 0                                    # sent again after a worker died or a result was refused
    stopped: dict = field(default_factory=dict)       # Job.path -> why it was not graded
    started: float = field(default_factory=time.monotonic)
    bar: object = None

    def __post_init__(self):
        from tqdm import tqdm
        self.bar = tqdm(total=self.total, unit="nb", desc="autograde", file=sys.stderr, disable=None,
                        dynamic_ncols=True, leave=False)

    def line(self, text: str) -> None:
        """One submission finished: its line, with done/total, the rate and the time left."""
        self.done += 1
        elapsed = time.monotonic() - self.started
        rate = self.done / max(elapsed, 1e-9) * 60
        left = (self.total - self.done) / rate * 60 if rate else 0
        text = f"[{self.done}/{self.total}, {rate:.1f}/min, {left:.0f} s left] {text}  ({elapsed:.0f} s)"
        self.say(text)
        self.bar.update(1)

    def say(self, text: str) -> None:
        if self.progress is print and not self.bar.disable:
            self.bar.write(text)
        else:
            self.progress(text)

    def close(self) -> None:
        self.bar.close()

    def summary(self) -> str:
        """How many were graded where, sent again, kept from an earlier run, not graded."""
        places = ", ".join(f"{count} on {where}" for where, count in sorted(self.where.items()))
        parts = [f"graded {sum(self.where.values())} of {self.total} submission(s)" + (f": {places}" if places else "")]
        if self.kept:
            parts.append(f"{self.kept} already graded (authentic results of an earlier run, kept)")
        if self.again:
            parts.append(f"{self.again} sent again (a worker died, or a result was refused)")
        if self.stopped:
            parts.append(f"{len(self.stopped)} not graded")
        return "; ".join(parts)


def refusal(reply, job: Job, key: bytes) -> str:
    """Why a worker's reply cannot be taken as `job`'s result ('' when it can)."""
    from engine.course.grading.cluster_task import reply_mac
    from engine.course.authoring.nbgrader_course import file_digest
    if not isinstance(reply, dict) or not isinstance(reply.get("mac"), str):
        return "it is not a signed result"
    if not hmac.compare_digest(reply["mac"], reply_mac(key, reply)):
        return "it fails authentication (not this task's key)"
    named = (reply.get("student"), reply.get("assignment"), reply.get("sha256"))
    if named != (job.student, job.assignment, file_digest(job.path)):
        return f"it is for another submission ({named[0]}/{named[1]}, sha256 {str(named[2])[:12]})"
    result = reply.get("result")
    if result is not None and (not isinstance(result, dict) or result.get("grader") != job.grader):
        return "it was graded under other settings (another chapter text, grader or limits)"
    return ""


def unreachable(address: str, seconds: float = 5) -> str:
    """Why nothing listens at a scheduler's tcp:// or tls:// address ('' when something does)."""
    import socket
    host, _, port = address.split("://", 1)[1].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
    except OSError as error:
        return (f"no Dask scheduler answers at {address} ({error.strerror or error}); start one with "
                "`dask scheduler` and workers with `dask worker ADDRESS --nthreads 1`")
    return ""


def connect(address: str, progress):
    """A client of the scheduler at `address` with at least one worker, or SystemExit saying what is missing."""
    from distributed import Client
    try:
        client = Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
    except (OSError, TimeoutError) as error:
        raise SystemExit(f"autograde: no Dask scheduler answers at {address} ({error}); start one with "
                         "`dask scheduler` and workers with `dask worker ADDRESS --nthreads 1`") from None
    try:
        client.wait_for_workers(1, timeout=CONNECT_SECONDS)
    except TimeoutError:
        client.close()
        raise SystemExit(f"autograde: the Dask scheduler at {address} has no worker after {CONNECT_SECONDS} s; "
                         "start them with `dask worker ADDRESS --nthreads 1`") from None
    workers = client.scheduler_info(n_workers=-1)["workers"]
    threads = sum(w.get("nthreads", 1) for w in workers.values())
    try:
        dashboard = client.dashboard_link
    except KeyError:
        dashboard = "none (install bokeh where the scheduler runs)"
    progress(f"cluster {address}: {len(workers)} worker(s), {threads} submission(s) at a time; dashboard: {dashboard}")
    return client


def _allow_failures(client, count: int | None) -> int | None:
    """Set the scheduler's allowed-failures (the worker deaths a task may cause before it is given up on);
    the value it had, or None where the scheduler takes no such call (its own setting then applies)."""
    def swap(dask_scheduler, count=count):
        before = dask_scheduler.allowed_failures
        dask_scheduler.allowed_failures = before if count is None else count
        return before
    try:
        return client.run_on_scheduler(swap)
    except Exception:
        return None


def grade_on_cluster(address: str, jobs: list[Job], tally: Tally, accept, names: dict[str, str]) -> None:
    """Grade every job on the cluster at `address`: accept(job, reply) for each authentic result (the
    caller writes it), tally.stopped[path] for each that could not be graded there. `names`: {student id:
    the name to print}."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    from engine.course.grading.cluster_task import GraderMismatch, grade_task
    client = connect(address, tally.say)
    before = _allow_failures(client, 0)
    running: dict = {}        # future -> (job, attempt, key)
    waiting = deque((job, 1, "") for job in jobs)
    deaths: Counter = Counter()

    def send(job: Job, attempt: int, avoid: str) -> None:
        key = secrets.token_bytes(32)
        task = {"student": job.student, "assignment": job.assignment, "notebook_name": job.path.name,
                "notebook": job.path.read_bytes(), "chapter_name": job.chapter.name,
                "chapter": job.chapter.read_bytes(), "timeout": job.grader["timeout"],
                "sandbox": job.grader["sandbox"], "limits": job.grader["limits"], "engine": job.grader["engine"],
                "key": key}
        others = [w for w in workers() if w != avoid] if avoid else []
        where = {"workers": others, "allow_other_workers": True} if others else {}
        future = client.submit(grade_task, task, key=f"autograde-{secrets.token_hex(8)}", pure=False, **where)
        running[future] = (job, attempt, key)
        pending.add(future)

    def workers() -> dict:
        return client.scheduler_info(n_workers=-1)["workers"]

    def fill() -> None:
        """As many submissions in flight as the cluster has threads now: each worker holds only what it
        runs, so a worker that dies takes down no submission but its own."""
        capacity = max(1, sum(w.get("nthreads", 1) for w in workers().values()))
        while waiting and len(running) < capacity:
            send(*waiting.popleft())

    def who(job: Job) -> str:
        return f"{names.get(job.student, job.student)} {job.path.stem}"

    pending = as_completed([], loop=client.loop)
    try:
        fill()
        for future in pending:
            job, attempt, key = running.pop(future)
            try:
                reply = future.result()
            except KilledWorker as error:
                deaths[job.path] += error.allowed_failures + 1
                if error.allowed_failures == 0 and attempt < ATTEMPTS:
                    tally.again += 1
                    tally.say(f"{who(job)}: its worker {error.last_worker.address} died; sent to another worker")
                    waiting.appendleft((job, attempt + 1, error.last_worker.address))
                else:
                    tally.stopped[job.path] = f"it stopped {deaths[job.path]} workers"
                    tally.line(f"{who(job)}: not graded: it stopped {deaths[job.path]} workers")
                fill()
                continue
            except GraderMismatch as error:
                raise SystemExit(f"autograde: {error}") from None
            except CancelledError:
                raise SystemExit(lost(address, tally)) from None
            except Exception as error:   # the worker could not run the grader at all (grade_file catches the rest)
                raise SystemExit(f"autograde: grading {who(job)} failed on the cluster: "
                                 f"{type(error).__name__}: {error}") from None
            why = refusal(reply, job, key)
            if why and attempt < ATTEMPTS:
                tally.again += 1
                tally.say(f"{who(job)}: result refused ({why}); graded again")
                waiting.appendleft((job, attempt + 1, reply.get("worker", "") if isinstance(reply, dict) else ""))
            elif why:
                tally.stopped[job.path] = f"its result was refused twice: {why}"
                tally.line(f"{who(job)}: not graded: its result was refused twice: {why}")
            else:
                accept(job, reply)
                tally.where[reply["worker"]] += 1
                tally.line(f"{who(job)}: {reply['score']} on {reply['worker']}")
            fill()
    except OSError as error:      # the scheduler's connection broke while sending
        raise SystemExit(lost(address, tally, error)) from None
    finally:
        if client.status == "running" and before is not None:
            _allow_failures(client, before)
        client.close()


def lost(address: str, tally: Tally, error: Exception | None = None) -> str:
    """The message when the scheduler goes away mid-run."""
    return (f"autograde: the Dask scheduler at {address} went away" + (f" ({error})" if error else "") +
            f" with {sum(tally.where.values())} of {tally.total} submission(s) graded; their results are kept in "
            "the course folder (course/sandbox/results): run the same command again and only the rest are graded")
