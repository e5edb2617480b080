"""Optional dependencies: what the controller image leaves out, and the error that names the extra.

The core distribution (and the controller image, docs/image.md) carries what `render` and the
controller need. The plots need matplotlib (`ghostgpu[plot]`), the local test cluster the kubernetes
client (`ghostgpu[devcluster]`); together about 300 MB that a controller never imports.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import `module`; without it, a BoundaryError that names the pip extra installing it (the
    CLI's boundary prints it as error:/fix: and exits 2, no traceback)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0]:
            raise  # the module is there but one of its own imports is broken: show that
        from ghostgpu.boundary import input_error

        raise input_error(
            f"{what} needs the '{module}' package, which this installation lacks",
            f"pip install 'ghostgpu[{extra}]'",
        ) from None
