"""The production server's admission rules (server/serving.py), without sockets.

Importing gevent here patches nothing: the gate is plain bookkeeping.
"""

from __future__ import annotations

import pytest

pytest.importorskip("gevent")
from server.serving import ConnectionGate, connection_budget  # noqa: E402


class Reader:
    """A handler still reading its headers."""

    def __init__(self) -> None:
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def test_the_budget_follows_the_descriptor_limit() -> None:
    assert connection_budget(0, 1024) == (1024 - 64) // 2
    assert connection_budget(100, 1024) == 100  # a smaller configured budget wins
    assert connection_budget(10**6, 1024) == 480  # never more than the descriptors allow


def test_one_address_is_capped_and_the_reserve_is_kept_for_newcomers() -> None:
    gate = ConnectionGate(budget=40, per_address=30)  # reserve: 40 // 8 = 5
    taken = sum(gate.admit("10.0.0.1") for _ in range(50))
    assert taken == 30  # its own cap
    taken = sum(gate.admit("10.0.0.2") for _ in range(50))
    assert taken == 5  # up to budget - reserve = 35 in all
    # The reserve goes to addresses holding almost nothing, one connection or a few each.
    assert all(gate.admit(f"10.0.1.{i}") for i in range(5))
    assert gate.open == 40
    assert not gate.admit("10.0.2.1")  # full, and nobody is stuck reading headers
    gate.release("10.0.0.1")
    assert gate.admit("10.0.2.1") and gate.held("10.0.2.1") == 1


def test_when_full_the_oldest_slow_request_makes_room() -> None:
    gate = ConnectionGate(budget=8, per_address=None)
    readers = []
    for i in range(8):
        assert gate.admit(f"10.0.0.{i}")
        readers.append(Reader())
        gate.reading(readers[-1])
    gate.done_reading(readers[0])  # the oldest got its headers through: it is safe
    assert gate.admit("10.9.9.9")
    assert [r.evicted for r in readers] == [False, True] + [False] * 6
    assert gate.evicted == 1
