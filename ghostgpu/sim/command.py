"""`ghostgpu bench [detectors]`: run the benchmark and print it (rich, Markdown or JSON)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ghostgpu.sim.plot import plot_window_sweep
from ghostgpu.sim.runner import BenchConfig, BenchResult, run_bench
from ghostgpu.sim.tables import markdown, rich_tables


def _run_with_progress(config: BenchConfig, err: Console) -> BenchResult:
    columns = (
        TextColumn("[bold]bench[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    # The bar goes to stderr and only on a terminal, so --json/--markdown stay clean when piped.
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("instances", total=config.total_instances)
        return run_bench(config, progress=lambda n: bar.advance(task, n))


def run_detector_command(config: BenchConfig, *, as_json: bool, as_markdown: bool, plot: Path | None) -> None:
    out, err = Console(), Console(stderr=True)
    started = time.perf_counter()
    result = _run_with_progress(config, err)
    elapsed = time.perf_counter() - started
    if plot is not None:
        plot_window_sweep(result, plot)
        err.print(f"plot written to {plot}")
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2, ensure_ascii=False))
    elif as_markdown:
        print(markdown(result), end="")
    else:
        for item in rich_tables(result):
            out.print(item)
            out.print()
    err.print(f"[dim]{config.total_instances:,} instances in {elapsed:.1f} s[/]")
