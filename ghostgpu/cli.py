"""The `ghostgpu` command line. Each command imports its implementation lazily so that
`ghostgpu render` never pays for kr8s or matplotlib."""

from __future__ import annotations

import typer

from ghostgpu import __version__

app = typer.Typer(
    name="ghostgpu",
    help="Find GPU workloads that bypass Kueue, prove they are idle, and reclaim them safely.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ghostgpu {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """ghostgpu command line."""


# --- render (issue 2) ---

# --- bench (issue 3) ---

# --- calibrate (issue 6) ---

# --- devcluster (issue 4) ---

# --- controller, status, report, restore (issue 5) ---
