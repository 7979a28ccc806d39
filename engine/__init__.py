"""A tiny Qwen3 inference engine with a paged KV cache, built chapter by chapter in the course."""
