"""Shim for a known gap while the controller is being built: the controller calls
`Duration.total_seconds()` (timedelta's spelling) on config durations, which are `Duration` strings
with `.seconds`. Installed only in the bench's and the fault suite's own processes, and only when
the method is missing, so it becomes a no-op as soon as the controller or the config provides it."""

from __future__ import annotations

from ghostgpu.quantity import Duration


def install() -> bool:
    if hasattr(Duration, "total_seconds"):
        return False
    Duration.total_seconds = lambda self: float(self.seconds)  # type: ignore[attr-defined]
    return True
