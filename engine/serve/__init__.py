"""Serving: continuous batching over the KV caches (the bench and simulator are in engine/tools/).

  request.py        Request (what a user asked for) and Sequence (one token stream in the cache)
  scheduler.py      token and KV budgets, admission, prefix-cache eviction, preemption (swap | recompute)
  engine.py         one ragged forward per step, per-request sampling, forks for n samples
  metrics.py        throughput, TTFT, KV utilization over time, preemptions, prefix hit rate
  beam.py           beam search on fork + copy-on-write (`python -m engine beam`)
  shared_prompt.py  requests sharing a system prompt, served through a PrefixCache (chapter 5)
"""
