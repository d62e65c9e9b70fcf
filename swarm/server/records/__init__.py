"""What the server knows of an episode: its record and GRPO group (``episode``), its token-exact
trace (``timeline``), the episodes held in memory (``registry``) and the finished record the durable
buffer stores with its binary encoding (``finished``). Plain data and its indexes, below everything
else in the server."""
