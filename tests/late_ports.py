"""A port for a listener that binds late: below the kernel's ephemeral range, so nothing takes it
first.

Why: a port picked by binding port 0 and closing (the suite's former ``free_port()``) comes from
the ephemeral range, the same range from which every outgoing connection and every other
``bind(("", 0))`` on the machine gets its port. A listener that binds port 0 itself and listens at
once is safe; one that binds a picked port later is not (Azurite, which Node starts in a second or
more, lost that race once, 2026-12-06), and every server of the suite in a process of its own
binds later (moto's, the GCS emulator, docker-registry, Azurite): the ranks' gloo TCPStore
binds after importing vLLM, ``vllm serve`` after loading the model, and meanwhile the suite's
servers, clients and engines take ephemeral ports by the thousand. A slow run (the cores at about
70 % of their speed, 2026-12-04) lost that race: rank 0's TCPStore failed with EADDRINUSE and every
test of tests/test_vllm_ranks.py errored. A port below ``ip_local_port_range`` is never chosen by
the kernel, so only another late listener could take it; picks are random over thousands of ports,
checked free, and never repeated in a process.
The same holds for ``store_servers.closed_port()`` (a port that must stay refused for a test).
This is about ports, not time: unlike the wall-clock aids the suite retired when budgets moved
to a fake clock (docs/adr/0010), nothing else can keep another process off a port.
"""

from __future__ import annotations

import random
import socket

_SPAN = 10_000
_given: set[int] = set()


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The lowest port the kernel hands out by itself (32768 where the file cannot be read)."""
    try:
        with open(path) as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def late_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A free port below the ephemeral range, not given before in this process."""
    top = ephemeral_low()
    low = max(1024, top - _SPAN)
    for _ in range(tries):
        port = random.randrange(low, top)
        if port in _given:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{top - 1} after {tries} tries")
