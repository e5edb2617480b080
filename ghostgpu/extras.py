"""Optional dependencies: what the controller image leaves out, and the error that names the extra.

The core distribution (and the controller image, docs/image.md) carries what `render` and the
controller need. The plots need matplotlib (`ghostgpu[plot]`), the local test cluster the kubernetes
client (`ghostgpu[devcluster]`); together about 300 MB that a controller never imports.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import typer


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import `module`; without it, print which pip extra installs it and exit 1 (no traceback)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0]:
            raise  # the module is there but one of its own imports is broken: show that
        typer.echo(
            f"{what} needs the '{module}' package, which this installation lacks: "
            f"pip install 'ghostgpu[{extra}]'",
            err=True,
        )
        raise typer.Exit(1) from None
