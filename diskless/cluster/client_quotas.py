"""Client quota configs: entities, validation of alterations, filters of descriptions (sans-IO).

Kafka's client quotas (KIP-13, KIP-55, KIP-546) are set on an *entity*: a user, a client id, or a
user and a client id together, each by name or as the default (name None). Each entity has some of
the keys ``producer_byte_rate``, ``consumer_byte_rate`` (integral bytes/s), ``request_percentage``
and ``controller_mutation_rate``. They live in the metadata store, one key per entity
(``client-quotas/<entity>``, see ``record_path``), so every broker sees an alteration through its
watch; ``broker/throttle.py`` enforces them.

``plan_alterations`` follows Kafka's ClientQuotaControlManager (its checks, order and messages:
INVALID_REQUEST for an empty, duplicated, unknown or badly combined entity type, an unknown key, a
non-integral byte rate, a key given twice). ``describe`` follows Kafka's ClientQuotasImage filter
rules (match types exact/default/any, ``strict``). Not supported here: ``ip`` entities
(``connection_creation_rate``): an alteration naming one is refused as Kafka refuses an entity
type it does not handle; a description filtering on ``ip`` is valid and matches nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from kio.schema.errors import ErrorCode

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
# Key -> whether Kafka declares it LONG (a value must be integral); the others are DOUBLE.
USER_CLIENT_KEYS = {
    PRODUCER_BYTE_RATE: True,
    CONSUMER_BYTE_RATE: True,
    REQUEST_PERCENTAGE: False,
    CONTROLLER_MUTATION_RATE: False,
}
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
RECORD_PREFIX = "client-quotas/"

# An entity: its (type, name) pairs sorted by type; a None name is the default entity of that type.
Entity = tuple[tuple[str, str | None], ...]
Quotas = dict[Entity, dict[str, float]]


class QuotaError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def entity_of(pairs: Iterable[tuple[str, str | None]]) -> Entity:
    return tuple(sorted(pairs))


def render(entity: Entity) -> str:
    """As Kafka's ClientQuotaEntity prints in messages."""
    return "ClientQuotaEntity(entries=" + ", ".join(f"{t}={n}" for t, n in entity) + ")"


def record_path(entity: Entity) -> str:
    """The store key of an entity's quotas: names may hold any character, '/' too."""
    return RECORD_PREFIX + quote(json.dumps(entity), safe="")


def entity_from_path(path: str) -> Entity:
    return entity_of(
        (str(t), None if n is None else str(n)) for t, n in json.loads(unquote(path[len(RECORD_PREFIX) :]))
    )


def encode_values(values: Mapping[str, float]) -> bytes:
    return json.dumps(dict(sorted(values.items()))).encode()


def decode_values(raw: bytes) -> dict[str, float]:
    return {str(k): float(v) for k, v in json.loads(raw).items()}


@dataclass
class Alteration:
    entity: Entity
    ops: list[tuple[str, float | None]] = field(default_factory=list)  # None: remove the key


def _check_entity(entity: Entity) -> None:
    """Kafka's validateEntity then configKeysForEntityType, with their messages."""
    if not entity:
        raise QuotaError(ErrorCode.invalid_request, "Invalid empty client quota entity")
    seen: set[str] = set()
    for kind, name in entity:
        if kind in seen:
            raise QuotaError(
                ErrorCode.invalid_request, f"Invalid empty client quota entity, duplicate entity entry {kind}"
            )
        seen.add(kind)
        if kind not in (USER, CLIENT_ID):  # ip is Kafka's too, but not handled here (module docstring)
            raise QuotaError(ErrorCode.invalid_request, f"Unhandled client quota entity type: {kind}")
        if name is not None and not name:
            raise QuotaError(ErrorCode.invalid_request, f"Empty {kind} not supported")


def _check_value(key: str, value: float) -> None:
    integral = USER_CLIENT_KEYS.get(key)
    if integral is None:
        raise QuotaError(ErrorCode.invalid_request, f"Invalid configuration key {key}")
    if integral and (not math.isfinite(value) or abs(math.floor(value + 1e-6) - value) > 1e-6):
        raise QuotaError(ErrorCode.invalid_request, f"Configuration {key} must be a Long value")
    if not value > 0:
        # Kafka accepts it and then throttles every request for ever (a division by zero); a
        # positive quota is what an operator means, so anything else is refused.
        raise QuotaError(ErrorCode.invalid_request, f"Configuration {key} must be positive")


def plan_alterations(
    current: Mapping[Entity, Mapping[str, float]], alterations: list[Alteration]
) -> tuple[dict[Entity, tuple[ErrorCode, str | None]], dict[Entity, dict[str, float]]]:
    """Each entity's outcome (code, message) and, for the entities that succeed, their quotas
    after the alteration (empty: the entity's record is deleted). Entities are independent: one
    refused leaves the others to be applied, as in Kafka."""
    results: dict[Entity, tuple[ErrorCode, str | None]] = {}
    after: dict[Entity, dict[str, float]] = {}
    for alteration in alterations:
        entity = alteration.entity
        if entity in results:
            results[entity] = (ErrorCode.invalid_request, f"Ignoring duplicate entity {render(entity)}")
            after.pop(entity, None)
            continue
        try:
            keys = [key for key, _ in alteration.ops]
            if len(set(keys)) != len(keys):
                twice = next(k for k in keys if keys.count(k) > 1)
                raise QuotaError(
                    ErrorCode.invalid_request,
                    f"Duplicate quota key {twice} not updating quota for this entity {render(entity)}",
                )
            _check_entity(entity)
            values = dict(current.get(entity, {}))
            for key, value in alteration.ops:
                if value is None:
                    values.pop(key, None)
                else:
                    _check_value(key, value)
                    values[key] = float(value)
        except QuotaError as exc:
            results[entity] = (exc.code, exc.message)
            continue
        results[entity] = (ErrorCode.none, None)
        after[entity] = values
    return results, after


@dataclass(frozen=True)
class Component:
    entity_type: str
    match_type: int
    match: str | None


def describe(quotas: Mapping[Entity, Mapping[str, float]], components: list[Component], strict: bool) -> Quotas:
    """The entities a DescribeClientQuotas filter matches, with their quotas (Kafka's rules).
    ``QuotaError`` for a filter Kafka refuses."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for c in components:
        if not c.entity_type:
            raise QuotaError(ErrorCode.invalid_request, "Invalid empty entity type.")
        if c.entity_type in exact or c.entity_type in specified:
            raise QuotaError(
                ErrorCode.invalid_request, f"Entity type {c.entity_type} cannot appear more than once in the filter."
            )
        if c.entity_type not in (USER, CLIENT_ID, IP):
            raise QuotaError(ErrorCode.unsupported_version, f"Unsupported entity type {c.entity_type}")
        if c.match_type == MATCH_EXACT:
            if c.match is None:
                raise QuotaError(
                    ErrorCode.invalid_request, "Request specified MATCH_TYPE_EXACT, but set match string to null."
                )
            exact[c.entity_type] = c.match
        elif c.match_type in (MATCH_DEFAULT, MATCH_SPECIFIED):
            if c.match is not None:
                what = "DEFAULT" if c.match_type == MATCH_DEFAULT else "SPECIFIED"
                raise QuotaError(
                    ErrorCode.invalid_request,
                    f"Request specified MATCH_TYPE_{what}, but also specified a match string.",
                )
            if c.match_type == MATCH_DEFAULT:
                exact[c.entity_type] = None
            else:
                specified.add(c.entity_type)
        else:
            raise QuotaError(ErrorCode.invalid_request, f"Unknown match type {c.match_type}")
    named = exact.keys() | specified
    if IP in named and (USER in named or CLIENT_ID in named):
        raise QuotaError(
            ErrorCode.invalid_request,
            "Invalid entity filter component combination. IP filter component should not be used with "
            "user or clientId filter component.",
        )
    if not named:
        # No component: every entity, unless strict (an entity of no type at all matches nothing).
        return {} if strict else {e: dict(v) for e, v in quotas.items()}
    out: Quotas = {}
    for entity, values in quotas.items():
        names = dict(entity)
        if any(t not in names or names[t] != n for t, n in exact.items()):
            continue
        if any(t not in names for t in specified):
            continue
        if strict and len(names) != len(named):
            continue
        out[entity] = dict(values)
    return out
