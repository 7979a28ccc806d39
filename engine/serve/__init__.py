"""Serving: continuous batching over the KV caches, with its scheduler, metrics, bench and simulator.

  request.py     Request (what a user asked for) and Sequence (one token stream in the cache)
  scheduler.py   token and KV budgets, admission, prefix-cache eviction, preemption (swap | recompute)
  engine.py      one ragged forward per step, per-request sampling, forks for n samples
  metrics.py     throughput, TTFT, KV utilization over time, preemptions, prefix hit rate
  contiguous.py  the baselines: one contiguous KV region per sequence (Max, Pow2, Oracle)
  beam.py        beam search on fork + copy-on-write
  simulate.py    the roofline cost model and GPU table for `bench --simulate`
  bench.py       `python -m engine bench`
"""
