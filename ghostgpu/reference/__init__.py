"""The reference pages under docs/reference/, generated from the code: every ghostgpu.yaml key
(config_keys), every metric and alert (metrics), every command and flag (cli). `hack/gen-reference`
writes them; `hack/gen-reference --check` (a unit test runs it) fails when one is stale."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "reference"
COMMAND = "hack/gen-reference"


def header(title: str, source: str) -> str:
    """The first lines of every page: what it is generated from and the one command that does it."""
    return (
        f"# {title}\n\n"
        f"Generated from {source}: do not edit it by hand, run `{COMMAND}` after changing them (a unit "
        "test fails when this page is stale).\n"
    )


def pages() -> dict[str, Callable[[], str]]:
    from ghostgpu.reference import cli, config_keys, metrics

    return {"config.md": config_keys.page, "metrics.md": metrics.page, "cli.md": cli.page}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, build in pages().items():
        path = OUT / name
        text = build()
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.relative_to(REPO).as_posix())
            continue
        OUT.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"stale: {', '.join(stale)}: run {COMMAND}", file=sys.stderr)
        return 1
    return 0
