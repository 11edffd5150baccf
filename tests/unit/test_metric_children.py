"""Hot paths count through children bound once (``diskless.metrics.child``) instead of calling
``labels()`` per request or read: the same child, the same samples, a fraction of the cost."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from diskless.metrics import child


def test_child_is_the_labelled_child_and_counts_into_it() -> None:
    registry = CollectorRegistry()
    counter = Counter("t_bytes", "test", ["direction", "az"], registry=registry)
    child(counter, "in", "a").inc(5)
    child(counter, "in", "a").inc(2)
    child(counter, "out", "a").inc(1)
    assert child(counter, "in", "a") is counter.labels("in", "a")
    assert registry.get_sample_value("t_bytes_total", {"direction": "in", "az": "a"}) == 7
    assert registry.get_sample_value("t_bytes_total", {"direction": "out", "az": "a"}) == 1


def test_child_asks_labels_once_per_label_set() -> None:
    """The saving is that ``labels()`` (validation and a lock) runs once per label set, not per
    call; the cost itself is measured by profiles, not by a timed test."""
    counter = Counter("t_cost", "test", ["op"], registry=CollectorRegistry())
    asked: list[tuple[str, ...]] = []
    real_labels = counter.labels

    def counting_labels(*values: str) -> object:
        asked.append(values)
        return real_labels(*values)

    counter.labels = counting_labels  # type: ignore[method-assign]
    for _ in range(1_000):
        child(counter, "put").inc()
        child(counter, "get").inc()
    assert asked == [("put",), ("get",)]
    assert real_labels("put")._value.get() == 1_000
