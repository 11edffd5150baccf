"""Encoded Metadata answers, reused while the cluster metadata they were built from is unchanged.

A Metadata answer for a topic of 10,000 partitions takes a fifth of a second of CPU to build and
encode, and clients ask for it again and again when leaders move (librdkafka refreshes a topic
every 100 ms or so while a partition has no leader). Under that load a broker spent most of its
time re-encoding identical answers, fell behind on its etcd lease and was fenced, which moved
more leaders and brought more Metadata requests. An answer is a function of the request, the
client's identity and connection (its decided AZ and listener), the API version and the cluster metadata,
whose ``generation`` moves on every change; it is reused while that generation holds, for at
most ``MAX_AGE_S`` (anything else an answer might come to depend on is that fresh). While leaders
move the generation moves with every ISR change, so an answer is also reused, whatever changed,
for ``MIN_AGE_S``: a broker's metadata is only ever a recent view (Kafka's brokers learn theirs
asynchronously too), and a client told a leader that just moved gets NOT_LEADER and asks again.
Only leader/ISR churn is forgiven that way: a change of topics or brokers (``topology``), such as
the partitions a CreatePartitions just added, invalidates every answer at once, because the
client that asked for it reads Metadata right after and must see it.
Answers carrying an error are never reused: those may create topics on the next request.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Hashable
from typing import Any

from diskless.protocol import messages as m
from diskless.protocol.framing import encode_frame

MAX_AGE_S = 1.0
MIN_AGE_S = 0.25
MAX_ENTRIES = 256

_CORRELATION = struct.Struct(">i")


class MetadataAnswerCache:
    def __init__(self) -> None:
        self._answers: dict[tuple[int, str | None, Hashable, Any], tuple[tuple[int, int], float, bytes]] = {}

    def get(
        self, header: m.RequestHeader, request: Any, generation: tuple[int, int], variant: Hashable = None
    ) -> bytes | None:
        """The encoded answer frame for this request, if a fresh one is cached. ``variant`` is what
        else the answer depends on: the connection's listener and decided client AZ, taken once by
        the caller for both ``get`` and ``put`` (a consumer's rack may change it in between).
        ``generation`` is the metadata's (generation, topology generation)."""
        try:
            cached = self._answers.get((header.api_version, header.client_id, variant, request))
        except TypeError:  # an unhashable request: never cached
            return None
        if cached is None:
            return None
        built_generation, built_at, rest = cached
        age = time.monotonic() - built_at
        if age > MAX_AGE_S or built_generation[1] != generation[1]:
            return None
        if built_generation != generation and age > MIN_AGE_S:
            return None
        return encode_frame(_CORRELATION.pack(header.correlation_id) + rest)

    def put(
        self,
        header: m.RequestHeader,
        request: Any,
        generation: tuple[int, int],
        body: dict[str, Any],
        frame: bytes,
        variant: Hashable = None,
    ) -> None:
        if any(t.get("error_code", 0) != 0 for t in body.get("topics", ())):
            return
        if len(self._answers) >= MAX_ENTRIES:
            self._answers.clear()
        with contextlib.suppress(TypeError):  # an unhashable request: never cached
            self._answers[(header.api_version, header.client_id, variant, request)] = (
                generation,
                time.monotonic(),
                frame[8:],
            )
