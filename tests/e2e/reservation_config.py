"""The controller section the reservation's e2e tests run with: short polls and windows, a lease of
its own per controller, and the reservation's queue."""

from __future__ import annotations

import uuid
from typing import Any


def reservation_section(
    prometheus_url: str, *, queue: str, poll_s: int, reservation: str = "enforce", mode: str = "enforce"
) -> dict[str, Any]:
    return {
        "mode": mode,
        "reservation": reservation,
        "reservationQueue": queue,
        "leaseName": f"ghostgpu-{uuid.uuid4().hex[:8]}",
        "pollInterval": f"{poll_s}s",
        "window": 3,
        "longWindow": 7,
        "startupGrace": "1s",
        "staleAfter": "30s",
        "prometheus": {"url": prometheus_url, "timeout": "5s"},
    }
