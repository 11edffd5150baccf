"""VerificationLines (log/txn_verification_order.py): a producer's batches take their turns in
arrival order whatever order their verifications end in; other producers are not held up; a line
exists only while a batch is in it."""

from __future__ import annotations

from dataclasses import dataclass

from diskless.log.txn_verification_order import VerificationLines


@dataclass
class Item:
    name: str
    verifying: bool = False


def turns(lines: VerificationLines[str, Item], key: str) -> list[str]:
    taken = []
    while (item := lines.next_turn(key)) is not None:
        taken.append(item.name)
    return taken


def test_turns_in_arrival_order_once_every_batch_ahead_is_verified() -> None:
    lines: VerificationLines[str, Item] = VerificationLines()
    assert not lines and not lines.has_line("p")
    first, second, third = Item("first", True), Item("second", True), Item("third")
    for item in (first, second, third):
        lines.join("p", item)
    second.verifying = False
    assert turns(lines, "p") == [], "the second's verification ended first: it still waits for the first"
    first.verifying = False
    assert turns(lines, "p") == ["first", "second", "third"]
    assert not lines and not lines.has_line("p"), "an empty line is gone: the fast path is open again"


def test_other_producers_are_not_held_up_and_drain_takes_all() -> None:
    lines: VerificationLines[str, Item] = VerificationLines()
    lines.join("p", Item("p1", True))
    lines.join("q", Item("q1"))
    assert turns(lines, "q") == ["q1"] and lines.has_line("p") and not lines.has_line("q")
    lines.join("p", Item("p2"))
    assert [item.name for item in lines.drain()] == ["p1", "p2"]
    assert not lines
