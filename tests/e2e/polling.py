"""Waiting on the live cluster: the e2e tests' one polling helper."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(check: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """Call `check` until it returns something truthy; exceptions mean "not there yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # not there yet
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
