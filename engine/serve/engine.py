"""The continuous-batching engine: requests in, a few unpadded forwards per step, tokens out.

Each `step()`:
  1. the scheduler picks prefill chunks and decode tokens and reserves their KV room;
  2. the runner runs them: the decode rows as one batch `[B, 1]`, prompt chunks in groups of similar
     length `[B, T]` (padding at position -1);
  3. every row that finished its pending tokens samples one token with its own generator;
  4. finished sequences are retired and their blocks freed at once, so the next step can use them.
A request for `n` samples is one sequence until its prompt is prefilled, then forks into `n`.
"""
from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from typing import Iterable

import torch

from engine.cache.protocol import PagedCache, implements
from engine.errors import InputError
from engine.generate import model_device, pack, token_list
from engine.model import check_prompt_ids
from engine.sampling import SamplingParams, check_seed, sample
from engine.serve.metrics import Metrics
from engine.serve.request import Request, Sequence, Status, make_generator
from engine.serve.scheduler import Chunk, Scheduler, SchedulerConfig


class UnknownRequest(InputError, KeyError):
    """A request id the engine never saw."""

    __str__ = Exception.__str__


class ModelRunner:
    """Runs the model on a ragged batch of rows through the cache; returns each row's last logits."""

    def __init__(self, model, cache):
        """Run `model` through `cache` (any protocol cache)."""
        self.model, self.cache = model, cache

    @functools.cached_property
    def device(self) -> torch.device:
        """The model's device, found once: walking its parameters cost ~0.1 ms a step."""
        return model_device(self.model)

    def forward(self, seq_ids: list[int], rows: list[list[int]], starts: list[int]) -> torch.Tensor:
        """Append rows[b] to sequence seq_ids[b] at positions starts[b]...; logits [B, vocab]."""
        self.cache.set_batch(seq_ids)
        token_ids, positions, last = self.inputs(rows, starts, self.device)
        return self.model(token_ids, positions, self.cache, only=last)

    @staticmethod
    def inputs(rows: list[list[int]], starts: list[int], device: torch.device):
        """token_ids, positions [B, T] and each row's last column [B] on `device`.

        On CUDA the three go in one asynchronous copy from pinned memory: a plain copy from pageable
        memory waits for the GPU to drain its queue first, three times a forward.
        """
        if device.type != "cuda":
            token_ids, positions = pack(rows, starts, device)
            return token_ids, positions, torch.tensor([len(r) - 1 for r in rows], device=device)
        token_ids, positions = pack(rows, starts)
        last = torch.tensor([len(r) - 1 for r in rows])
        n = token_ids.numel()
        flat = torch.cat([token_ids.flatten(), positions.flatten(), last]).pin_memory().to(device, non_blocking=True)
        return flat[:n].view_as(token_ids), flat[n:2 * n].view_as(positions), flat[2 * n:]

    def execute(self, chunks: list[Chunk]) -> tuple[torch.Tensor, float | None]:
        """One engine step's forward. The second value is a modelled duration (None: measure it).

        The decode rows (one token each) run as one batch, as nano-vllm and vLLM V0 do: packed with
        a prompt chunk, every decode row would be padded to the chunk's width and pay for positions
        it does not have. Prompt chunks of similar length share a forward (see `row_groups`).
        """
        groups = row_groups(chunks)
        if len(groups) == 1 and groups[0] == list(range(len(chunks))):   # one forward, rows in order: no copy
            return self.forward([c.seq.seq_id for c in chunks], [c.tokens for c in chunks],
                                [c.start for c in chunks]), None
        logits = None
        for group in groups:
            part = self.forward([chunks[i].seq.seq_id for i in group], [chunks[i].tokens for i in group],
                                [chunks[i].start for i in group])
            if logits is None:
                logits = part.new_empty(len(chunks), part.shape[-1])
            logits[group] = part
        return logits, None


# What one more forward costs beyond its tokens (Python, op launches), in padded token positions. On a
# 2-core CPU a forward of the small bench models costs about 7 ms before its first token, the price of
# 30-50 tokens; on a GPU launches cost relatively more, so grouping pays at least as well there.
FORWARD_COST_TOKENS = 32


def row_groups(chunks: list[Chunk], forward_cost: int = FORWARD_COST_TOKENS) -> list[list[int]]:
    """Indices of the chunks, grouped into forwards: all decodes in one, prompt chunks by length.

    Prompt chunks are taken shortest first; a chunk joins the open group when the padding the group
    would then hold (rows x widest - tokens) is at most `forward_cost` per forward saved, and opens
    a new group otherwise. `forward_cost=0` runs every prompt chunk alone, with no padding at all.
    """
    decodes = [i for i, chunk in enumerate(chunks) if chunk.count == 1]
    prompts = sorted((i for i, chunk in enumerate(chunks) if chunk.count != 1), key=lambda i: chunks[i].count)
    groups: list[list[int]] = [decodes] if decodes else []
    group: list[int] = []
    tokens = 0
    for i in prompts:
        count = chunks[i].count
        padding = (len(group) + 1) * count - (tokens + count)   # the newcomer is the widest row
        if group and padding > forward_cost * len(group):
            groups.append(group)
            group, tokens = [], 0
        group.append(i)
        tokens += count
    return groups + ([group] if group else [])


class Engine:
    """Continuous batching over any protocol cache, with prefix caching, preemption and forks."""

    def __init__(self, model, cache, config: SchedulerConfig | None = None, prefix_caching: bool = True,
                 runner=None, eos_token_id: int | None = None, keep_logits: bool = False):
        """Prefix caching needs a paged cache (it shares blocks); it is skipped for slot caches."""
        prefix = None
        if prefix_caching and implements(cache, PagedCache):
            from engine.cache.prefix import PrefixCache
            prefix = PrefixCache(cache)
        self.cache, self.scheduler = cache, Scheduler(cache, config, prefix)
        self.runner = runner or ModelRunner(model, cache)
        model_eos = getattr(getattr(model, "config", None), "eos_token_id", None)
        self.eos = eos_token_id if eos_token_id is not None else model_eos
        self.vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)  # None: a modelled run
        self.keep_logits = keep_logits
        self.requests: dict[int, Request] = {}
        self.metrics = Metrics()
        self.now = 0.0                                 # engine clock: the sum of step durations
        self.upcoming: list[tuple[float, int, Sequence]] = []  # heap of requests not yet arrived
        self._seq_ids = itertools.count()
        self._request_ids = itertools.count()
        # What requests and sequences are made by: the grader makes them where the learner's scheduler lives.
        self.make_request, self.make_sequence = Request, Sequence

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: SamplingParams | None = None, seed: int | None = None,
                    n: int = 1, request_id: int | None = None, arrival: float | None = None) -> Request:
        """Queue a request; sample i draws with seed + i (seed defaults to params.seed, else 0).

        With `arrival` (engine-clock seconds) the request joins the queue only once the clock gets
        there; an idle engine skips ahead to the next arrival. Latency counts from the arrival.
        Raises RequestTooLarge (and changes nothing) when the request could never fit the cache.
        """
        params = params or SamplingParams()
        request_id = next(self._request_ids) if request_id is None else request_id
        what = f"request {request_id}"
        prompt = token_list(prompt, what)             # a list or a 1-D integer tensor of ids
        if not isinstance(params, SamplingParams):
            raise InputError(f"{what}: params must be a SamplingParams, got {type(params).__name__}")
        if not prompt:
            raise InputError(f"{what}: the prompt is empty: give at least one token id")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"{what}: n (samples) must be an int >= 1, got {n!r}")
        if request_id in self.requests:
            raise InputError(f"{what}: this request_id is taken: give a new one")
        if arrival is not None and not (isinstance(arrival, (int, float)) and 0 <= arrival < math.inf):
            raise InputError(f"{what}: arrival must be a finite number of engine-clock seconds >= 0, "
                             f"got {arrival!r}")
        seed = seed if seed is not None else (params.seed if params.seed is not None else 0)
        check_seed(seed, f"{what}: seed", n)
        if self.vocab_size is not None:
            check_prompt_ids(prompt, self.vocab_size, what)
        self.scheduler.check_fits(request_id, len(prompt), params.max_tokens)   # every check before any change
        later = arrival is not None and arrival > self.now
        request = self.make_request(request_id, list(prompt), params, seed, n,
                                    arrival=self.now if arrival is None else arrival)
        self.requests[request_id] = request
        if params.max_tokens == 0:
            return request
        seq = self.make_sequence(next(self._seq_ids), request, list(prompt), make_generator(seed))
        request.sequences.append(seq)
        if later:
            heapq.heappush(self.upcoming, (arrival, seq.seq_id, seq))
        else:
            self.scheduler.add(seq)
        return request

    def _arrive(self) -> None:
        """Queue the requests whose arrival time has come; when idle, jump the clock to the next one."""
        if self.upcoming and not self.scheduler.has_work():
            self.now = max(self.now, self.upcoming[0][0])
        while self.upcoming and self.upcoming[0][0] <= self.now:
            self.scheduler.add(heapq.heappop(self.upcoming)[2])

    def abort(self, request_id: int) -> None:
        """Stop a request wherever it is; its blocks are freed at once and it is finished from then on
        (also a request for n samples whose prompt never ran, so it never split into them)."""
        if request_id not in self.requests:
            known = sorted(self.requests)
            listed = ", ".join(map(str, known[:10])) + (", ..." if len(known) > 10 else "")
            raise UnknownRequest(f"abort: no request {request_id} (known ids: {listed or 'none'})")
        # not arrived yet: it never reaches the scheduler
        self.upcoming = [entry for entry in self.upcoming if entry[2].request.request_id != request_id]
        heapq.heapify(self.upcoming)
        request = self.requests[request_id]
        request.aborted = request.aborted or not request.finished    # finished from now on, forked or not
        for seq in request.sequences:
            if seq.status is not Status.FINISHED:
                self.scheduler.finish(seq, "aborted")

    def has_unfinished(self) -> bool:
        """True while some sequence still waits, runs, sits swapped, or has yet to arrive."""
        return bool(self.upcoming) or self.scheduler.has_work()

    # ---- one step ----------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Schedule, run one forward, sample, retire. Returns the sequences that finished.

        An idle engine (nothing waiting, running, swapped or yet to arrive) has no work: the step
        returns [] and changes nothing.
        """
        if not self.has_unfinished():
            return []
        self._arrive()
        started = time.perf_counter()
        chunks = self.scheduler.schedule()
        if not chunks:
            if self.scheduler.running or self.scheduler.swapped:
                return []                              # nothing fit this step: try again next step
            raise RuntimeError(f"scheduler is stuck: {len(self.scheduler.waiting)} waiting sequence(s), "
                               "nothing running, and the first cannot be admitted into an empty cache")
        logits, modelled = self.runner.execute(chunks)
        # Tokens sampled in this step exist once the forward is done: advance the clock first.
        self.now += modelled if modelled is not None else time.perf_counter() - started
        sampling_started = time.perf_counter()
        finished = []
        greedy = logits.argmax(dim=-1).tolist()        # one argmax for the batch: what temperature 0 picks
        for chunk, row, best in zip(chunks, logits, greedy):
            seq = chunk.seq
            seq.num_computed += chunk.count
            if chunk.start < seq.prompt_len:           # prompt blocks: share them as soon as they fill
                self.scheduler.publish(seq)
            if seq.num_pending == 0:                   # the whole history is in: sample the next token
                finished += self._sample(seq, row, best)
        if modelled is None:
            self.now += time.perf_counter() - sampling_started
        self.metrics.record_step(self, chunks)
        return finished

    def _sample(self, seq: Sequence, row: torch.Tensor, best: int) -> list[Sequence]:
        """Sample for `seq` (and, right after a prompt, fork it into n samples); return finished ones.

        `best` is the row's argmax, the greedy choice, computed for the whole batch at once.
        """
        request = seq.request
        family = [seq]
        if not seq.forked:                             # prompt done: one prefill, n samples
            family += self.scheduler.fork_samples(seq, self._seq_ids)
        done = []
        for member in family:
            greedy = request.params.temperature == 0
            token = best if greedy else sample(row, request.params, self.generator_of(member))
            member.tokens.append(token)
            if self.keep_logits:
                member.logits.append(row.detach().clone())
            if member.first_token_time is None:
                member.first_token_time = self.now
            if self.eos is not None and token == self.eos and not request.params.ignore_eos:
                reason = "stop"
            elif len(member.output) >= request.params.max_tokens:
                reason = "length"
            else:
                continue
            self.scheduler.finish(member, reason)
            member.finish_time = self.now
            done.append(member)
        return done

    # ---- whole runs --------------------------------------------------------------------------
    def generator_of(self, seq: Sequence) -> torch.Generator:
        """The generator `seq` samples from: its own (a grader holding a copy of it draws from that copy)."""
        return seq.generator

    def run(self, progress: bool | None = None, desc: str = "requests") -> list[Request]:
        """Step until every request is done; a tqdm bar (stderr) counts finished requests on long runs."""
        total = sum(1 for r in self.requests.values() if not r.finished)
        bar = None
        if progress or (progress is None and total >= 64):
            from tqdm import tqdm
            bar = tqdm(total=total, desc=desc, unit="req", leave=False)
        while self.has_unfinished():
            for seq in self.step():
                if bar is not None and seq.request.finished:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return list(self.requests.values())

    def generate(self, prompts: Iterable[list[int]], params: SamplingParams | None = None,
                 seeds: Iterable[int] | None = None, n: int = 1) -> list[Request]:
        """Convenience: add every prompt (with its seed), run to the end, return the requests."""
        prompts = list(prompts)
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)
        added = [self.add_request(p, params, seed=s, n=n) for p, s in zip(prompts, seeds)]
        self.run(progress=False)
        return added
