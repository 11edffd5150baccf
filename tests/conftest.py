"""Shared fixtures: ``broker`` starts one real broker process; ``broker_factory`` starts more."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support import BrokerProcess


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []

    def make(overrides: dict[str, str] | None = None, name: str = "broker") -> BrokerProcess:
        proc = BrokerProcess(tmp_path / f"{name}-{len(started)}", overrides)
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        proc.kill()


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory()
