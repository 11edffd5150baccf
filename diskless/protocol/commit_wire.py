"""CommitBatches bodies on the wire: the representative's entries without repeated names. Sans-IO.

A representative sends one CommitBatches per leader broker per WAL flush, most of them to another
AZ, with an entry per produced batch; as a msgpack map per entry (``topic``, ``topic_id``,
``partition``, ``header``, ...) an entry is ~190 bytes around its 61-byte header, and the WAL object
key is ~75 bytes of text. On the wire (``internal.pack_request``) the body becomes::

    {"k": WAL object key (storage/pointer_wire.encode_key), "c": created_ms, "w": replication_wait_ms,
     "runs": [[topic, topic_id, [[partition, header, position, acks, leader_epoch(, txn_guard)], ...]], ...]}

where a topic id that is a UUID's canonical text travels as its 16 bytes and the batch header as
its fields (``pointer_wire.encode_header``, ~25 bytes for 61).

Runs are consecutive entries of one topic, so the order of entries, which is the order the leader
appends them in, is kept exactly; ``expand`` gives back the body the representative built. A body
with anything this layout does not know travels as it is, and the leader reads both forms (older
representatives send maps). AwaitReplicated bodies travel in runs the same way (``compact_await``).
"""

from __future__ import annotations

import uuid
from typing import Any

from diskless.storage import pointer_wire
from diskless.storage.pointer_wire import decode_header, decode_key, encode_header, encode_key

_ENTRY_FIELDS = ("partition", "header", "position", "acks", "leader_epoch")
_OPTIONAL = "txn_guard"
_BODY_FIELDS = frozenset({"key", "created_ms", "replication_wait_ms", "entries"})
_ENTRY_KEYS = frozenset({"topic", "topic_id", *_ENTRY_FIELDS})
_SHORT = {"created_ms": "c", "replication_wait_ms": "w"}


def _id_out(topic_id: Any) -> Any:
    if isinstance(topic_id, str) and len(topic_id) == 36:
        try:
            parsed = uuid.UUID(topic_id)
        except ValueError:
            return topic_id
        if str(parsed) == topic_id:
            return parsed.bytes
    return topic_id


def _id_in(topic_id: Any) -> Any:
    return str(uuid.UUID(bytes=topic_id)) if isinstance(topic_id, bytes) and len(topic_id) == 16 else topic_id


def _add_to_runs(runs: list[list[Any]], entry: dict[str, Any], row: list[Any]) -> None:
    """Append ``row`` to the run of ``entry``'s topic when it is the last run's, else start one:
    consecutive entries only, so the order of entries is kept exactly."""
    if runs and runs[-1][0] == entry["topic"] and runs[-1][1] == entry["topic_id"]:
        runs[-1][2].append(row)
    else:
        runs.append([entry["topic"], entry["topic_id"], [row]])


def _wire_runs(runs: list[list[Any]]) -> list[list[Any]]:
    return [[topic, _id_out(topic_id), rows] for topic, topic_id, rows in runs]


def _run_entries(
    body: dict[str, Any], fields: tuple[str, ...], optional: str | None, what: str
) -> list[dict[str, Any]]:
    """The entries of a wire form's runs, as maps (``ValueError`` for a row of another length)."""
    entries: list[dict[str, Any]] = []
    lengths = (len(fields), len(fields) + 1) if optional is not None else (len(fields),)
    for topic, topic_id, rows in body["runs"]:
        for row in rows:
            if len(row) not in lengths:
                raise ValueError(f"malformed {what} entry")
            entry: dict[str, Any] = {"topic": topic, "topic_id": _id_in(topic_id)}
            entry.update(zip(fields, row, strict=False))
            if optional is not None and len(row) > len(fields):
                entry[optional] = row[-1]
            entries.append(entry)
    return entries


def compact(body: dict[str, Any]) -> dict[str, Any]:
    """The wire form of a CommitBatches body (the body itself when it has fields this does not know)."""
    entries = body.get("entries")
    if not set(body) <= _BODY_FIELDS or not isinstance(entries, list) or not isinstance(body.get("key"), str):
        return body
    runs: list[list[Any]] = []
    for entry in entries:
        keys = set(entry)
        if keys != _ENTRY_KEYS and keys != _ENTRY_KEYS | {_OPTIONAL}:
            return body
        header = entry["header"]
        fields = encode_header(header) if isinstance(header, (bytes, bytearray, memoryview)) else None
        if fields is None:
            return body
        row = [entry["partition"], fields, entry["position"], entry["acks"], entry["leader_epoch"]]
        if _OPTIONAL in entry:
            row.append(entry[_OPTIONAL])
        _add_to_runs(runs, entry, row)
    out = {short: body[name] for name, short in _SHORT.items() if name in body}
    return {"k": encode_key(body["key"]), **out, "runs": _wire_runs(runs)}


def expand(body: dict[str, Any]) -> dict[str, Any]:
    """The body the representative built, from either form (``ValueError`` on a malformed wire form)."""
    if "runs" not in body:
        return body
    entries = _run_entries(body, _ENTRY_FIELDS, _OPTIONAL, "CommitBatches")
    for entry in entries:
        try:
            entry["header"] = decode_header(entry["header"])
        except Exception as exc:
            raise ValueError(f"malformed CommitBatches header: {exc}") from None
    try:
        key = decode_key(body["k"])
    except Exception as exc:
        raise ValueError(f"malformed CommitBatches key: {exc}") from None
    out = {name: body[short] for name, short in _SHORT.items() if short in body}
    return {"key": key, **out, "entries": entries}


# AwaitReplicated: a representative asks each leader, usually in another AZ, about every acks=all
# batch its CommitBatches answer did not already report replicated. As maps an entry is ~100 bytes
# (topic name and id text for three integers); on the wire it is
#     {"w": max_wait_ms, "runs": [[topic, topic_id, [[partition, offset, leader_epoch], ...]], ...]}
# with runs and topic ids as in CommitBatches, ~10 bytes an entry.
_AWAIT_FIELDS = ("partition", "offset", "leader_epoch")
_AWAIT_ENTRY_KEYS = frozenset({"topic", "topic_id", *_AWAIT_FIELDS})


def compact_await(body: dict[str, Any]) -> dict[str, Any]:
    """The wire form of an AwaitReplicated body (the body itself when it has fields this does not know)."""
    entries = body.get("entries")
    if set(body) != {"max_wait_ms", "entries"} or not isinstance(entries, list):
        return body
    runs: list[list[Any]] = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != _AWAIT_ENTRY_KEYS:
            return body
        _add_to_runs(runs, entry, [entry[name] for name in _AWAIT_FIELDS])
    return {"w": body["max_wait_ms"], "runs": _wire_runs(runs)}


def expand_await(body: dict[str, Any]) -> dict[str, Any]:
    """The body the representative built, from either form (``ValueError`` on a malformed wire form)."""
    if "runs" not in body:
        return body
    return {"max_wait_ms": body["w"], "entries": _run_entries(body, _AWAIT_FIELDS, None, "AwaitReplicated")}


# Answers: {"results": [...]} whose every result has one of these key sets travels as
# {"rows": [[schema, values...], ...]} (CommitBatches' successes are ~120 bytes of names as maps).
_ANSWER_SCHEMAS = (
    ("error_code",),
    ("error_code", "base_offset", "last_offset", "leader_epoch", "committed", "log_append_time", "log_start_offset"),
    ("error_code", "done"),
)
_SCHEMA_OF = {frozenset(names): (index, names) for index, names in enumerate(_ANSWER_SCHEMAS)}
ANSWER_KEY = "rows"
# FetchPointers answers (pointer entries for a broker with no replica, usually in another AZ):
# their ``data`` as ``pointer_wire`` encodes a replica fetch's entries.
POINTERS_KEY = "pdata"


def compact_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """The wire form of an answer made only of ``results`` in known shapes, or of a FetchPointers
    answer with pointer entries (else the answer itself)."""
    data = answer.get("data")
    if answer.get("kind") == "pointers" and isinstance(data, (bytes, bytearray)) and POINTERS_KEY not in answer:
        encoded = pointer_wire.encode(data)
        if encoded is None:
            return answer
        out = {key: value for key, value in answer.items() if key != "data"}
        out[POINTERS_KEY] = encoded
        return out
    results = answer.get("results")
    if len(answer) != 1 or not isinstance(results, list):
        return answer
    rows = []
    for result in results:
        found = _SCHEMA_OF.get(frozenset(result)) if isinstance(result, dict) else None
        if found is None:
            return answer
        index, names = found
        rows.append([index, *(result[name] for name in names)])
    return {ANSWER_KEY: rows}


def expand_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """Inverse of ``compact_answer`` (any other answer as it is)."""
    if POINTERS_KEY in answer and "data" not in answer:
        out = {key: value for key, value in answer.items() if key != POINTERS_KEY}
        try:
            out["data"] = pointer_wire.decode(answer[POINTERS_KEY])
        except pointer_wire.CorruptEntry as exc:
            raise ValueError(f"malformed FetchPointers entries: {exc}") from None
        return out
    rows = answer.get(ANSWER_KEY)
    if len(answer) != 1 or not isinstance(rows, list):
        return answer
    results = []
    for row in rows:
        names = _ANSWER_SCHEMAS[row[0]]
        if len(row) != len(names) + 1:
            raise ValueError("malformed compact answer row")
        results.append(dict(zip(names, row[1:], strict=True)))
    return {"results": results}
