"""Listening ports for local servers are picked below the kernel's ephemeral range
(diskless/local/servers.py free_ports): an outgoing connection can never hold one of them."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from diskless.local import servers
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


def test_a_port_handed_out_is_not_handed_out_again_until_its_reservation_lapses(monkeypatch, tmp_path) -> None:
    """Being free to bind is not enough: a port handed out a moment ago is still free until its
    server starts, and a parallel test worker picking then got the same one (CI: a broker's
    "address already in use"). The picks here all land on one port, so before reservations the
    second pick returned it again."""
    if servers._ports_below_ephemeral(0) is None:
        pytest.skip("no room below the ephemeral range on this machine")
    monkeypatch.setattr(servers, "PORT_RESERVATIONS", tmp_path / "reservations")
    port = free_ports(1)[0]
    monkeypatch.setattr(servers.random, "randint", lambda low, high: port)
    (tmp_path / "reservations" / str(port)).unlink(missing_ok=True)  # as if another process picked it
    assert free_ports(1) == [port]
    with pytest.raises(RuntimeError, match="no free ports"):
        free_ports(1)
    lapsed = time.time() - servers.PORT_RESERVED_FOR_S - 1
    os.utime(tmp_path / "reservations" / str(port), (lapsed, lapsed))
    assert free_ports(1) == [port]


def test_a_port_pair_is_reserved_as_a_pair(monkeypatch, tmp_path) -> None:
    """SeaweedFS listens on ``port`` and ``port + 10000``: a claim on either one makes the pair taken."""
    if servers._ports_below_ephemeral(10000) is None:
        pytest.skip("no room below the ephemeral range on this machine")
    monkeypatch.setattr(servers, "PORT_RESERVATIONS", tmp_path / "reservations")
    port = free_ports(1, plus=10000)[0]
    shutil.rmtree(tmp_path / "reservations", ignore_errors=True)
    (tmp_path / "reservations").mkdir()
    (tmp_path / "reservations" / str(port + 10000)).touch()  # another process holds the upper one
    monkeypatch.setattr(servers.random, "randint", lambda low, high: port)
    with pytest.raises(RuntimeError, match="no free ports"):
        free_ports(1, plus=10000)
