"""tests/late_ports.py: ports for late listeners never come from the range the kernel hands out."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import late_ports


def test_a_late_port_is_free_below_the_ephemeral_range_and_never_given_twice() -> None:
    low = late_ports.ephemeral_low()
    ports = [late_ports.late_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(max(1024, low - late_ports._SPAN) <= port < low for port in ports), (low, ports)
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free: nothing else on the machine picks from there


def test_a_taken_port_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    low = late_ports.ephemeral_low()
    picks = iter([low - 1, low - 2])
    monkeypatch.setattr(late_ports.random, "randrange", lambda a, b: next(picks))
    monkeypatch.setattr(late_ports, "_given", set())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", low - 1))
        assert late_ports.late_port() == low - 2


def test_the_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert late_ports.ephemeral_low(str(ranges)) == 40000
    assert late_ports.ephemeral_low(str(tmp_path / "missing")) == 32768
