"""Test modules live in folders without __init__.py, so pytest imports them by base name: two
files of the same name (tests/unit/x.py and tests/e2e/x.py) break collection of the whole run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py")
    assert [n for n, c in names.items() if c > 1] == []
