"""``free_block``: ports for test and drill servers, chosen outside the kernel's ephemeral range so an
outgoing connection's source port cannot take one before the server binds it."""

import socket

import pytest

from inferctl.tools.drill import fleet
from inferctl.tools.drill.config import DrillError


def test_block_is_free_and_outside_the_ephemeral_range():
    lo, hi = fleet._ephemeral_range()
    for _ in range(20):
        base = fleet.free_block(4)
        assert not lo <= base <= hi and not lo <= base + 3 <= hi
        for port in range(base, base + 4):           # each port can still be bound
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))


def test_a_taken_port_is_never_returned(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(fleet, "_ephemeral_range", lambda: (taken + 1, 65000))
        # the only candidate range is 20000..taken: force every draw onto the taken port first
        draws = iter([taken, taken, taken - 1])
        monkeypatch.setattr(fleet.random.Random, "randint", lambda self, a, b: next(draws))
        assert fleet.free_block(1) == taken - 1


def test_no_free_block_raises_naming_the_range(monkeypatch):
    monkeypatch.setattr(fleet, "_ephemeral_range", lambda: (32768, 60999))

    def bind_fails(self, addr):
        raise OSError("in use")
    monkeypatch.setattr(fleet.socket.socket, "bind", bind_fails)
    with pytest.raises(DrillError, match=r"no block of 2 free ports on 127\.0\.0\.1 in 20000"):
        fleet.free_block(2)
