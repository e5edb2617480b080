"""The reservation step of a poll logs what it wrote without failing the poll: a log record's
`extra` may not name a LogRecord attribute (`created`), or logging raises and the poll fails after
its writes (seen in the devcluster, tests/e2e/test_dra_devcluster.py: "poll failed ... Attempt to overwrite
'created' in LogRecord")."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ghostgpu.controller.books.placeholders import ReservationMetrics, reserve
from ghostgpu.controller.books.reservation import ReservationReport
from ghostgpu.controller.poll import PollResult, Snapshot


class _Writes:
    """A Reservations whose reconcile created one placeholder and deleted another."""

    local_queue = "q"
    mode = "enforce"

    async def local_queues(self) -> list[dict[str, Any]]:
        return []

    async def skipped_queues(self, cluster_queues: Any) -> dict[str, str]:
        return {}

    async def reconcile(self, desired: Any, flavors: Any, **_: Any) -> ReservationReport:
        return ReservationReport(mode="enforce", created=1, deleted=1)


async def test_a_poll_that_writes_placeholders_logs_the_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ghostgpu.controller.reservation")
    metrics = ReservationMetrics(CollectorRegistry())
    snap = Snapshot({}, {}, [], [])
    await reserve(_Writes(), metrics, [], snap, [], PollResult(started=0.0), [], leader=True)  # type: ignore[arg-type]
    [rec] = [r for r in caplog.records if r.getMessage() == "reservations"]
    assert (rec.placeholdersCreated, rec.placeholdersDeleted, rec.errors) == (1, 1, 0)  # type: ignore[attr-defined]
