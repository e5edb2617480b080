"""Ships the top-level templates/ and examples/ghostgpu.yaml inside the wheel.

The Jinja2 sources live at the repository top level (docs/design.md#layout). A wheel gets copies under
ghostgpu/_data/; an editable install reads the originals (ghostgpu/resources.py looks in both).
All other metadata lives in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # editable installs read templates/ and examples/ in place
        data = Path(self.build_lib) / "ghostgpu" / "_data"
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(ROOT / "templates", data / "templates", ignore=shutil.ignore_patterns("__pycache__"))
        (data / "examples").mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / "examples" / "ghostgpu.yaml", data / "examples" / "ghostgpu.yaml")


setup(cmdclass={"build_py": BuildPyWithData})
