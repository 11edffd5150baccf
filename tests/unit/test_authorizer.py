"""The ACL authorizer (security/acl.py): Kafka's StandardAuthorizer rules, without a broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diskless.security.acl import (
    ALL,
    ALLOW,
    ALTER,
    ALTER_CONFIGS,
    ANY,
    CLUSTER,
    DENY,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    LITERAL,
    MATCH,
    PREFIXED,
    READ,
    TOPIC,
    WRITE,
    AclBinding,
    AclFilter,
    Authorizer,
    validate_binding,
)

ALICE, BOB = "User:alice", "User:bob"


def acl(
    resource: int, name: str, principal: str, op: int, permission: int = ALLOW, pattern: int = LITERAL
) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, "*", op, permission)


def authorizer(*acls: AclBinding, allow_if_none: bool = False, supers: tuple[str, ...] = ()) -> Authorizer:
    a = Authorizer(super_users=frozenset(supers), allow_everyone_if_no_acl_found=allow_if_none)
    a.replace(acls)
    return a


def test_literal_prefixed_and_wildcard_allow() -> None:
    a = authorizer(
        acl(TOPIC, "orders", ALICE, WRITE),
        acl(TOPIC, "logs-", BOB, READ, pattern=PREFIXED),
        acl(GROUP, "*", BOB, READ),
    )
    assert a.authorize(ALICE, "10.0.0.1", WRITE, TOPIC, "orders")
    assert not a.authorize(ALICE, "10.0.0.1", WRITE, TOPIC, "orders2")
    assert not a.authorize(BOB, "10.0.0.1", WRITE, TOPIC, "orders")
    assert a.authorize(BOB, "h", READ, TOPIC, "logs-app")
    assert not a.authorize(BOB, "h", READ, TOPIC, "log")
    assert a.authorize(BOB, "h", READ, GROUP, "any-group")


def test_implied_operations() -> None:
    a = authorizer(
        acl(TOPIC, "t", ALICE, WRITE), acl(TOPIC, "t", BOB, ALTER_CONFIGS), acl(CLUSTER, "kafka-cluster", ALICE, ALL)
    )
    assert a.authorize(ALICE, "h", DESCRIBE, TOPIC, "t")  # WRITE implies DESCRIBE
    assert not a.authorize(ALICE, "h", READ, TOPIC, "t")
    assert a.authorize(BOB, "h", DESCRIBE_CONFIGS, TOPIC, "t")  # ALTER_CONFIGS implies DESCRIBE_CONFIGS
    assert not a.authorize(BOB, "h", DESCRIBE, TOPIC, "t")
    assert a.authorize(ALICE, "h", ALTER, CLUSTER, "kafka-cluster")


def test_deny_wins_and_host_matters() -> None:
    a = authorizer(
        acl(TOPIC, "*", "User:*", READ),
        acl(TOPIC, "secret", BOB, READ, permission=DENY),
        AclBinding(TOPIC, "hosted", LITERAL, ALICE, "10.0.0.1", READ, ALLOW),
    )
    assert a.authorize(ALICE, "h", READ, TOPIC, "secret")
    assert not a.authorize(BOB, "h", READ, TOPIC, "secret")
    assert a.authorize(BOB, "h", READ, TOPIC, "public")
    assert a.authorize(ALICE, "10.0.0.1", READ, TOPIC, "hosted")


def test_no_acl_found_and_super_users() -> None:
    assert not authorizer().authorize(ALICE, "h", WRITE, TOPIC, "t")
    assert authorizer(allow_if_none=True).authorize(ALICE, "h", WRITE, TOPIC, "t")
    # An ACL on the resource (for anyone) means "found": the default no longer applies.
    assert not authorizer(acl(TOPIC, "t", BOB, READ), allow_if_none=True).authorize(ALICE, "h", WRITE, TOPIC, "t")
    assert authorizer(acl(TOPIC, "t", BOB, READ, permission=DENY), supers=(BOB,)).authorize(BOB, "h", READ, TOPIC, "t")


def test_filters() -> None:
    bindings = [
        acl(TOPIC, "orders", ALICE, WRITE),
        acl(TOPIC, "ord", BOB, READ, pattern=PREFIXED),
        acl(TOPIC, "*", BOB, DESCRIBE),
        acl(GROUP, "g", ALICE, READ),
    ]
    everything = AclFilter(ANY, None, ANY, None, None, ANY, ANY)
    assert [b for b in bindings if everything.matches(b)] == bindings
    match = AclFilter(TOPIC, "orders", MATCH, None, None, ANY, ANY)
    assert [b for b in bindings if match.matches(b)] == bindings[:3]
    literal = AclFilter(TOPIC, "orders", LITERAL, None, None, ANY, ANY)
    assert [b for b in bindings if literal.matches(b)] == bindings[:1]
    by_principal = AclFilter(ANY, None, ANY, ALICE, None, ANY, ALLOW)
    assert [b for b in bindings if by_principal.matches(b)] == [bindings[0], bindings[3]]


def test_validation() -> None:
    assert validate_binding(acl(TOPIC, "t", ALICE, READ)) is None
    assert validate_binding(AclBinding(TOPIC, "t", MATCH, ALICE, "*", READ, ALLOW)) is not None
    assert validate_binding(AclBinding(ANY, "t", LITERAL, ALICE, "*", READ, ALLOW)) is not None
    assert validate_binding(AclBinding(TOPIC, "t", LITERAL, "alice", "*", READ, ALLOW)) is not None
    assert validate_binding(AclBinding(TOPIC, "t", LITERAL, ALICE, "*", ANY, ALLOW)) is not None


@given(st.text(min_size=1, max_size=8), st.sampled_from([READ, WRITE, DESCRIBE, ALTER]))
def test_an_allow_for_one_principal_never_lets_another_in(name: str, op: int) -> None:
    a = authorizer(acl(TOPIC, name, ALICE, op))
    assert a.authorize(ALICE, "h", op, TOPIC, name)
    assert not a.authorize(BOB, "h", op, TOPIC, name)


def test_decisions_follow_every_replacement_of_the_acls() -> None:
    a = authorizer(acl(TOPIC, "t", ALICE, READ))
    assert a.authorize(ALICE, "h", READ, TOPIC, "t")
    a.replace([acl(TOPIC, "t", ALICE, READ, permission=DENY)])
    assert not a.authorize(ALICE, "h", READ, TOPIC, "t")
    a.replace([acl(TOPIC, "t", BOB, READ), acl(TOPIC, "*", ALICE, READ)])
    assert a.authorize(ALICE, "h", READ, TOPIC, "t") and a.authorize(ALICE, "h", READ, TOPIC, "*")
