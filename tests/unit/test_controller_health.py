"""/healthz of the poll loop: slow is not stuck."""

from __future__ import annotations

from ghostgpu.controller.app import loop_healthy


def test_healthy_while_polls_end_or_progress() -> None:
    interval = 60.0  # unhealthy after 3 intervals + 60 s = 240 s without a sign of life
    assert loop_healthy(1_000.0, 900.0, interval, None, None) == (True, "last start 100s ago")
    assert loop_healthy(1_300.0, 900.0, interval, None, None)[0] is False  # never polled
    assert loop_healthy(1_300.0, 900.0, interval, 1_200.0, None) == (True, "last poll ended 100s ago")
    # a long poll (first verdicts of a large fleet): its last poll ended long ago, but writes go on
    assert loop_healthy(2_000.0, 900.0, interval, 1_200.0, 1_990.0) == (True, "last progress 10s ago")
    stuck = loop_healthy(2_000.0, 900.0, interval, 1_200.0, 1_500.0)
    assert stuck == (False, "last progress 500s ago")
