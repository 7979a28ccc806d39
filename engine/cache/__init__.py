"""KV caches behind one protocol: static slots, and the paged cache with its allocator and prefix cache."""
