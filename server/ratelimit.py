"""Token buckets: the per-connection frame, byte and strike budgets of signaling, and the
log lines each client address may cause (LinesPerKey)."""

from __future__ import annotations

import threading
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


class LinesPerKey:
    """The log lines each key (a client's address group) may cause: `burst` at once, then
    `rate` a second, so that a client repeating a refused request cannot flood the log.

    Thread-safe: every connection shares it. It remembers at most `keys` keys, forgetting
    the one quiet longest (and how many of its lines were left out) first.
    """

    def __init__(self, rate: float, burst: float, keys: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if keys < 1:
            raise ValueError(f"keys must be positive, got {keys}")
        TokenBucket(rate, burst)  # the same checks on rate and burst
        self.rate, self.burst, self.keys = rate, burst, keys
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[TokenBucket, list[int]]] = {}  # quiet longest first

    def admit(self, key: str) -> int | None:
        """None: leave this line out; else how many of the key's lines were left out since
        its last one written (0 mostly), for the line to say."""
        with self._lock:
            entry = self._buckets.pop(key, None)
            if entry is None:
                entry = (TokenBucket(self.rate, self.burst, self._clock), [0])
                while len(self._buckets) >= self.keys:
                    del self._buckets[next(iter(self._buckets))]
            self._buckets[key] = entry
            bucket, left_out = entry
            if not bucket.take():
                left_out[0] += 1
                return None
            count, left_out[0] = left_out[0], 0
            return count
