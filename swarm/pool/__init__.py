"""The inference pool: rollout workers behind one server, and how each new policy version reaches them
(``shards``: versioned, chunked, SHA-256-checked payloads; ``bucket``: upload shaping; ``relay``: the
pipelined relay chain over HTTP and catch-up fetches)."""
