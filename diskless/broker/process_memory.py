"""Process-wide memory settings of a broker process: glibc malloc's mmap threshold and arena count,
and Python's garbage collector.

A broker's large allocations are transient buffers (WAL objects being built or fetched, request
and response frames, cache entries) interleaved with small long-lived objects. glibc's default
raises its mmap threshold to the size of the largest mmapped chunk freed so far (up to 32 MiB),
so after the first freed WAL object every later one is carved from the heap, whose free space
returns to the OS only from its top: a small object allocated after a big buffer keeps the whole
span resident, and RSS ratchets up to the peak of buffered bytes and stays there (measured in
``tests/unit/test_broker_memory.py``: 96 MiB of freed 2 MiB buffers stayed resident). A fixed
threshold turns the dynamic adjustment off, so large buffers are mmapped and unmapped when freed.
glibc also gives each thread that allocates its own arena (up to 8 per core), each keeping its own
free memory; the broker's threads (object-store pool, gRPC's) need few.

Settings an operator exported (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_ARENA_MAX``) are left alone.

Python's cyclic garbage collector walks every container object of a generation it collects: a
full (generation 2) collection of a broker's heap after start-up (modules, kio's schema classes,
metadata) held the event loop for 37-51 ms, twice in a two-minute benchmark run, on the path of
every request in flight. Start-up objects live as long as the process, so once the broker serves
they are frozen (``gc.freeze``): later collections never walk them. Each collection's pause is a
metric (``diskless_gc_pause_seconds``).

What the broker builds after start-up (topics' replicas, logs, sessions, memos) is not frozen,
and at 1,000 partitions a full collection of it held the loop ~70-110 ms. Full collections are
driven by promotions: CPython collects the youngest generation after every 700 net container
allocations, and whatever is alive then is promoted, however briefly it would have lived. A
broker's cyclic garbage (asyncio futures and tasks, exceptions with their frames) and its objects
in flight for a few milliseconds (requests, answers) were promoted that way, and once pending
promotions reach a quarter of the long-lived heap, the next collection is a full one: 3-10 of
them per broker in each 20 s phase, 60-75 ms of pauses per broker per second (``diskless bench
--partitions 1000``, all three runs measured with CPython's threshold). A youngest-generation
threshold of ``GC_GEN0_THRESHOLD`` lets those objects die young: no full collection in any run
since, 2-5 ms of pauses per second. The older generations keep CPython's thresholds; a young
collection walks at most that many objects (~1-2 ms). The cost: garbage in cycles lives longer,
~15 MB more peak RSS per broker at 12 partitions.

Server processes also never load hypothesis, which kio imports whenever it is installed (to
register test strategies): in development and benchmark environments that was 17 MB of RSS and
over a second of start-up per broker (``tests/server_site`` does the same for test processes).
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import sys
import time
from typing import Any

import structlog

from diskless.metrics import GC_FROZEN_OBJECTS, GC_PAUSE_SECONDS, child

log = structlog.get_logger(__name__)

# mallopt parameters (glibc's malloc.h).
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

# Net container allocations between collections of the youngest generation (CPython: 700).
GC_GEN0_THRESHOLD = 20_000

# Allocations from this size on are mmapped, and each costs page faults when touched (~0.5 s CPU
# per GB here, against ~0.04 s reusing heap memory): 1 MiB catches WAL objects, object-store
# bodies and fetch responses, the buffers that ratchet RSS up, while produce batches and frames
# below it keep reusing the heap.
MMAP_THRESHOLD_BYTES = 1024 * 1024
ARENA_MAX = 2


def tune_malloc(environ: dict[str, str] | None = None) -> dict[str, int]:
    """Apply the settings; returns what was set (nothing off glibc)."""
    env = os.environ if environ is None else environ
    if platform.libc_ver()[0] != "glibc":
        return {}
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = {}
    for variable, parameter, value in (
        ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENA_MAX),
    ):
        if variable not in env and mallopt(parameter, value) == 1:
            applied[variable] = value
    log.debug("malloc settings", **applied)
    return applied


def tune_gc() -> tuple[int, int, int]:
    """Collect the youngest generation less often (see the module docstring); returns the thresholds."""
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, middle, old)
    return gc.get_threshold()


def hide_test_only_modules() -> None:
    """Make ``import hypothesis`` fail in this process unless something imported it already."""
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now out of the collector's reach for good;
    returns how many were frozen. Call when start-up is done: what is alive then lives as long as
    the process."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    GC_FROZEN_OBJECTS.set(frozen)
    log.debug("start-up heap frozen", objects=frozen)
    return frozen


def observe_gc_pauses() -> None:
    """Time every collection into ``diskless_gc_pause_seconds`` (once per process)."""
    if _on_gc in gc.callbacks:
        return
    gc.callbacks.append(_on_gc)


_gc_started = [0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        child(GC_PAUSE_SECONDS, str(info["generation"])).observe(time.perf_counter() - _gc_started[0])
