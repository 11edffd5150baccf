"""ACLs and the authorizer (sans-IO), with Kafka's StandardAuthorizer rules.

An ACL binding allows or denies one principal (``User:alice``, or ``User:*``) from one host (or
``*``) one operation on resources named literally, by prefix, or ``*``. A request is authorized
when the principal is a super user (``super.users``), or no DENY binding matches and an ALLOW
binding matches; when no binding at all names the resource, ``allow.everyone.if.no.acl.found``
decides. READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS;
ALL implies everything (for DENY too, as Kafka).

``SUPPORTED_OPERATIONS`` and ``operations_bit_field`` make the authorized-operations bit sets
(KIP-430) that Metadata, DescribeCluster, DescribeGroups, ConsumerGroupDescribe and
DescribeTopicPartitions answer with: bit ``1 << code`` for each operation of the resource's type
the principal is allowed.

``AclFilter`` is what DescribeAcls and DeleteAcls send: ANY matches any value, MATCH matches
every binding that would apply to the named resource.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

# org.apache.kafka.common.resource.ResourceType
ANY = 1  # (ANY is 1 in every enum below)
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER = 2, 3, 4, 5, 6, 7
# PatternType
MATCH, LITERAL, PREFIXED = 2, 3, 4
# AclOperation
ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 2, 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12
CREATE_TOKENS, DESCRIBE_TOKENS = 13, 14
# AclPermissionType
DENY, ALLOW = 2, 3

CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
RESOURCE_TYPES = frozenset({TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER})
OPERATIONS = frozenset(range(ALL, DESCRIBE_TOKENS + 1))
# AclEntry.supportedOperations: the operations a resource of each type is ever authorized for;
# an authorized-operations bit set names only these (ALL is never one of its bits).
SUPPORTED_OPERATIONS: dict[int, frozenset[int]] = {
    TOPIC: frozenset({READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS}),
    GROUP: frozenset({READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS}),
    CLUSTER: frozenset({CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE}),
    TRANSACTIONAL_ID: frozenset({DESCRIBE, WRITE}),
    DELEGATION_TOKEN: frozenset({DESCRIBE}),
    USER: frozenset({CREATE_TOKENS, DESCRIBE_TOKENS}),
}
_IMPLIED_BY = {
    DESCRIBE: frozenset({DESCRIBE, READ, WRITE, DELETE, ALTER, ALL}),
    DESCRIBE_CONFIGS: frozenset({DESCRIBE_CONFIGS, ALTER_CONFIGS, ALL}),
}


def operations_bit_field(operations: Iterable[int]) -> int:
    """The int32 bit set of ``operations``, bit ``1 << code`` each (Kafka's Utils.to32BitField);
    every operation code is below 31, so the value is never negative."""
    bits = 0
    for operation in operations:
        bits |= 1 << operation
    return bits


@dataclass(frozen=True)
class AclBinding:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    def key(self) -> str:
        """A stable id: the same binding created twice is stored once."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]

    def applies_to(self, resource_type: int, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == LITERAL:
            return self.resource_name in (name, WILDCARD)
        return self.pattern_type == PREFIXED and name.startswith(self.resource_name)


@dataclass(frozen=True)
class AclFilter:
    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission_type: int

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type != ANY and self.resource_type != binding.resource_type:
            return False
        if self.pattern_type == MATCH:
            if self.resource_name is not None and not binding.applies_to(binding.resource_type, self.resource_name):
                return False
        else:
            if self.pattern_type != ANY and self.pattern_type != binding.pattern_type:
                return False
            if self.resource_name is not None and self.resource_name != binding.resource_name:
                return False
        if self.principal is not None and self.principal != binding.principal:
            return False
        if self.host is not None and self.host != binding.host:
            return False
        if self.operation != ANY and self.operation != binding.operation:
            return False
        return self.permission_type == ANY or self.permission_type == binding.permission_type


def validate_binding(binding: AclBinding) -> str | None:
    """Why CreateAcls must refuse a binding (INVALID_REQUEST), or None."""
    if binding.resource_type not in RESOURCE_TYPES:
        return "invalid resource type"
    if binding.pattern_type not in (LITERAL, PREFIXED):
        return "pattern type must be LITERAL or PREFIXED"
    if not binding.resource_name:
        return "empty resource name"
    if binding.resource_type == CLUSTER and binding.resource_name != CLUSTER_NAME:
        return f"the cluster resource is named {CLUSTER_NAME}"
    kind, sep, name = binding.principal.partition(":")
    if not sep or not kind or not name:
        return "principal must be Type:name"
    if binding.operation not in OPERATIONS:
        return "invalid operation"
    if binding.permission_type not in (ALLOW, DENY):
        return "permission type must be ALLOW or DENY"
    if not binding.host:
        return "empty host"
    return None


class Authorizer:
    """Decisions over the current set of bindings. Literal bindings are indexed by name and
    decisions are memoised until the set changes: a request's check must not scan every ACL."""

    CACHE_LIMIT = 100_000  # decisions remembered; cleared whole beyond it (bounded memory)

    def __init__(self, super_users: frozenset[str] = frozenset(), allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = super_users
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._all: list[AclBinding] = []
        self._literal: dict[tuple[int, str], list[AclBinding]] = {}
        self._prefixed: dict[int, list[AclBinding]] = {}
        self._decisions: dict[tuple[str, str, int, int, str], bool] = {}

    def replace(self, bindings: Iterable[AclBinding]) -> None:
        """Swap in the whole set (ACLs are few and change rarely)."""
        literal: dict[tuple[int, str], list[AclBinding]] = {}
        prefixed: dict[int, list[AclBinding]] = {}
        everything = list(bindings)
        for binding in everything:
            if binding.pattern_type == PREFIXED:
                prefixed.setdefault(binding.resource_type, []).append(binding)
            else:
                literal.setdefault((binding.resource_type, binding.resource_name), []).append(binding)
        self._all, self._literal, self._prefixed = everything, literal, prefixed
        self._decisions = {}

    def bindings(self) -> list[AclBinding]:
        return list(self._all)

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        if principal in self.super_users:
            return True
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(principal, host, operation, resource_type, name)
            if len(self._decisions) >= self.CACHE_LIMIT:
                self._decisions = {}
            self._decisions[key] = decision
        return decision

    def _decide(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        found = [
            *self._literal.get((resource_type, name), ()),
            *(self._literal.get((resource_type, WILDCARD), ()) if name != WILDCARD else ()),
            *(b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.resource_name)),
        ]
        if not found:
            return self.allow_everyone_if_no_acl_found
        kind = principal.partition(":")[0]
        mine = [b for b in found if b.principal in (principal, f"{kind}:{WILDCARD}") and b.host in (host, WILDCARD)]
        if any(b.permission_type == DENY and b.operation in (operation, ALL) for b in mine):
            return False
        allowed_by = _IMPLIED_BY.get(operation, frozenset({operation, ALL}))
        return any(b.permission_type == ALLOW and b.operation in allowed_by for b in mine)
