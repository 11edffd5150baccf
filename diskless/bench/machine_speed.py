"""How fast this machine runs Python: a fixed workload, timed before a bench and every second in it.

Every figure of ``diskless bench`` is bound by CPU on small machines, and the same machine is not
equally fast from one day, or one minute, to the next (a VM shares its host; its steal time may
show none of it). Without a measure of the machine, a slower run cannot be told from slower code
except by running the old commit again beside the new one on the same day. On an idle 2-core VM,
six measurements a few seconds apart gave 7.9, 8.0, 7.9, 12.7, 12.8 and 8.1 ms. So the bench
measures once before the cluster starts (``measure``), and its sampler probes every second while
it runs (``probe``); each phase reports the median of its seconds.

The workload is interpreter work of the kind a broker does per request (struct headers, varints,
dicts, small bytes objects, a crc32c) and depends on nothing in the project, so code changes never
move it: only the machine does. Its CPU time is the quickest of several rounds (another process
running meanwhile can only lengthen a round). Under the bench's own load a probe also reads the
cache contention of the machine's other processes: the speed the brokers get.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import crc32c

_HEADER = struct.Struct(">qiibIhiqqqhii")
ROUNDS = 15
UNITS_PER_ROUND = 2000
PROBE_ROUNDS = 3
PROBE_UNITS = 300


def _varint(value: int, out: bytearray) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _unit(index: int, table: dict[tuple[str, int], int]) -> int:
    """One request's worth of interpreter work; returns something that depends on all of it."""
    header = _HEADER.pack(index, 1000, 3, 2, 0, 0, 1, 1_700_000_000_000 + index, 1_700_000_000_007, -1, -1, -1, 2)
    fields = _HEADER.unpack(header)
    out = bytearray()
    for value in fields:
        _varint(value * 2 if value >= 0 else -value * 2 - 1, out)
    key = ("topic-%d" % (index % 12), index % 12)  # noqa: UP031 - fixed work, not style
    table[key] = table.get(key, 0) + len(out)
    parts = [bytes(out), header, str(index).encode()]
    return crc32c.crc32c(b"".join(parts)) ^ sum(fields[:3])


def measure(rounds: int = ROUNDS, units: int = UNITS_PER_ROUND) -> dict[str, Any]:
    """``python_ms``: CPU ms of ``UNITS_PER_ROUND`` units of the fixed workload, from the quickest
    round (lower is a faster machine); ``wall_to_cpu``: that round's wall time over its CPU time
    (near 1.0 on an idle machine). The CPU time is this thread's, so the figure is the same
    whichever thread measures and whatever the process's other threads do."""
    best_cpu = best_wall = float("inf")
    check = 0
    for _ in range(rounds):
        table: dict[tuple[str, int], int] = {}
        wall, cpu = time.perf_counter(), time.thread_time()
        for index in range(units):
            check ^= _unit(index, table)
        cpu = time.thread_time() - cpu
        wall = time.perf_counter() - wall
        if cpu < best_cpu:
            best_cpu, best_wall = cpu, wall
    return {
        "python_ms": round(best_cpu * 1000 * UNITS_PER_ROUND / units, 2),
        "wall_to_cpu": round(best_wall / best_cpu, 2) if best_cpu > 0 else None,
        "units": units,
        "check": check,  # keeps the work observable
    }


def probe() -> float:
    """A quick ``python_ms`` (~4 ms of CPU) for the bench's sampler to take every second."""
    return float(measure(rounds=PROBE_ROUNDS, units=PROBE_UNITS)["python_ms"])
