"""Glue between `ghostgpu calibrate` (cli.py) and the calibration modules; returns an exit code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from ghostgpu.autonomy import AutonomyConfig, CalibrationSettings
from ghostgpu.calibration.incidents import IncidentFileError
from ghostgpu.calibration.report import print_text, run, to_json
from ghostgpu.config_errors import ConfigError


def _autonomy(config_path: Path | None) -> AutonomyConfig:
    if config_path is None:
        return AutonomyConfig()
    from ghostgpu.config import load_config  # raises ConfigError with file/key/line

    return load_config(config_path).controller.autonomy


def run_calibrate_command(
    incidents: Path | None,
    config_path: Path | None,
    ceiling: float | None,
    autonomous_latency: float | None,
    escalation_latency: float | None,
    step: float | None,
    per_type_ceiling: str | None,
    as_json: bool,
    plot: Path | None,
    echo: Callable[..., None],
) -> int:
    if per_type_ceiling not in (None, "pooled", "each"):
        echo(f"error: --per-type-ceiling: expected pooled or each, got {per_type_ceiling!r}", err=True)
        return 2
    try:
        autonomy = _autonomy(config_path)
        overrides = {
            k: v
            for k, v in {
                "ceiling": ceiling,
                "autonomous_latency_seconds": autonomous_latency,
                "escalation_latency_seconds": escalation_latency,
                "tau_step": step,
                "per_type_ceiling": per_type_ceiling,
            }.items()
            if v is not None
        }
        settings = CalibrationSettings.model_validate({**autonomy.calibration.model_dump(), **overrides})
        result = run(incidents, autonomy, settings)
    except (IncidentFileError, ConfigError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        echo(f"error: {exc}", err=True)
        return 2
    if plot is not None:
        from ghostgpu.calibration.plot import plot_calibration

        where = "built-in incident set" if incidents is None else str(incidents)
        plot_calibration(result.result, plot, title=f"ghostgpu calibrate: {where}, {result.events} events")
    if as_json:
        echo(to_json(result))
    else:
        console = Console(width=120, soft_wrap=False, highlight=False)
        print_text(result, console)
        if plot is not None:
            console.print(f"plot written to {plot}")
    return 0
