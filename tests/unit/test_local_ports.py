"""Listening ports for local servers are picked below the kernel's ephemeral range
(diskless/local/servers.py free_ports): an outgoing connection can never hold one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from diskless.local.servers import free_ports


def test_picked_ports_are_below_the_ephemeral_range_and_distinct() -> None:
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not path.exists():
        pytest.skip("no /proc ephemeral port range here")
    low = int(path.read_text().split()[0])
    if low < 12000:
        pytest.skip("no room below the ephemeral range on this machine")
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(1024 < port < low for port in ports), (ports, low)
    assert all(port + 10000 < low for port in free_ports(5, plus=10000))
