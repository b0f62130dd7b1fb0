"""Token buckets: the per-connection frame, byte and strike budgets of signaling."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """``burst`` tokens at most, refilled at ``rate`` per second; ``take`` spends them.

    Not thread-safe on purpose: each connection owns its buckets and uses them from its
    own thread only.
    """

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"rate and burst must be positive, got {rate}, {burst}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def take(self, amount: float = 1.0) -> bool:
        """Spend ``amount`` tokens if there are that many; False (nothing spent) otherwise.

        An amount larger than the burst can never pass, so a single oversize request
        cannot drain the bucket either.
        """
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if amount > self._tokens:
            return False
        self._tokens -= amount
        return True

    @property
    def tokens(self) -> float:
        return self._tokens
