"""Find the Jinja2 templates and the embedded example config.

They live at the repository top level (templates/, examples/ghostgpu.yaml; docs/design.md#layout). A wheel
carries copies inside the package (ghostgpu/_data/, added by setup.py's build_py); an editable
install or a source checkout reads the top-level originals. The package copy wins when present.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_BUNDLED = _PACKAGE_DIR / "_data"
_SOURCE_ROOT = _PACKAGE_DIR.parent


def templates_dir() -> Path:
    for candidate in (_BUNDLED / "templates", _SOURCE_ROOT / "templates"):
        if (candidate / "policies").is_dir():
            return candidate
    raise FileNotFoundError(f"ghostgpu templates not found in {_BUNDLED} or {_SOURCE_ROOT}")


def example_config_path() -> Path:
    for candidate in (_BUNDLED / "examples" / "ghostgpu.yaml", _SOURCE_ROOT / "examples" / "ghostgpu.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"embedded examples/ghostgpu.yaml not found in {_BUNDLED} or {_SOURCE_ROOT}")
