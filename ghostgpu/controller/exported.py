"""Every series the controller serves on /metrics, built on one registry: `run_controller` serves
it, and docs/reference/metrics.md is generated from it (hack/gen-reference), so a metric added here
is documented by the next generation."""

from __future__ import annotations

from dataclasses import dataclass

from ghostgpu.controller.books.placeholders import ReservationMetrics
from ghostgpu.controller.budget import BudgetMetrics
from ghostgpu.controller.metrics import ControllerMetrics


@dataclass(frozen=True)
class ExportedMetrics:
    controller: ControllerMetrics  # its registry carries the others too
    budget: BudgetMetrics
    reservation: ReservationMetrics


def exported_metrics() -> ExportedMetrics:
    metrics = ControllerMetrics()
    return ExportedMetrics(metrics, BudgetMetrics(metrics.registry), ReservationMetrics(metrics.registry))
