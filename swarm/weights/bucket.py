"""An asyncio token bucket in bytes per second: how one sender shapes its upload.

Every node that sends weights (the server, each relaying worker) owns one bucket and takes its bytes
from it before each send, so the upload of that node stays at ``rate_bytes_per_s`` however many
transfers share it (a star push shares the server's one bucket across all workers). A take larger
than what is in the bucket runs it into debt and sleeps the debt off, so chunks bigger than the burst
pass at exactly the rate. Takers are served in arrival order (an ``asyncio.Lock``), one loop only.
"""

from __future__ import annotations

import asyncio
import time

_MIN_BURST = 64 * 1024


class TokenBucket:
    """``rate_bytes_per_s=None``: unlimited (``take`` returns at once). ``burst_bytes`` defaults to
    50 ms worth of the rate (at least 64 KiB): what may go out at once after an idle spell."""

    def __init__(self, rate_bytes_per_s: float | None, burst_bytes: int | None = None) -> None:
        if rate_bytes_per_s is not None and not rate_bytes_per_s > 0:
            raise ValueError(f"rate_bytes_per_s must be positive or None, got {rate_bytes_per_s}")
        if burst_bytes is not None and burst_bytes <= 0:
            raise ValueError(f"burst_bytes must be positive or None, got {burst_bytes}")
        self.rate = rate_bytes_per_s
        self.burst = float(burst_bytes or max(_MIN_BURST, (rate_bytes_per_s or 0.0) * 0.05))
        self._tokens = self.burst
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        """Wait until ``n`` bytes may be sent at this bucket's rate."""
        if self.rate is None or n <= 0:
            return
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self.rate)
