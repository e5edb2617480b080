"""Glue between `ghostgpu calibrate` (cli.py) and the calibration modules; returns an exit code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from ghostgpu.autonomy import AutonomyConfig, CalibrationSettings
from ghostgpu.boundary import Override, input_error, validated_overrides
from ghostgpu.calibration.incidents import IncidentFileError
from ghostgpu.calibration.report import print_text, run, to_json


def _autonomy(config_path: Path | None) -> AutonomyConfig:
    if config_path is None:
        return AutonomyConfig()
    from ghostgpu.config import read_config_file  # either shape; raises ConfigError with file/key/line

    return read_config_file(config_path).controller.autonomy


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
    """Exit 0; a bad flag, config or incident file raises a BoundaryError or ConfigError (exit 2)."""
    autonomy = _autonomy(config_path)
    flags = [
        Override(key, flag, given)
        for key, flag, given in (
            ("ceiling", "--ceiling", ceiling),
            ("autonomous_latency_seconds", "--autonomous-latency", autonomous_latency),
            ("escalation_latency_seconds", "--escalation-latency", escalation_latency),
            ("tau_step", "--step", step),
            ("per_type_ceiling", "--per-type-ceiling", per_type_ceiling),
        )
        if given is not None
    ]
    base = autonomy.calibration.model_dump()
    settings = validated_overrides(CalibrationSettings, base, flags)
    try:
        result = run(incidents, autonomy, settings)
    except IncidentFileError as exc:
        raise input_error(
            str(exc),
            "give --incidents a file as docs/autonomy.md describes (rows of manifest, action, "
            "incident_type, dangerous), or leave it out for the built-in set",
        ) from None
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
