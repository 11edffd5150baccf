"""Test modules under tests/ have distinct file names: the suite runs as one tree (rootdir-relative
imports, no packages), and pytest refuses to collect a second module of the same name. Twice this
session a new unit test shared its name with an integration test; only a whole-tree run showed it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_no_two_test_modules_share_a_name() -> None:
    tests = Path(__file__).resolve().parents[1]
    names = Counter(path.name for path in tests.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
