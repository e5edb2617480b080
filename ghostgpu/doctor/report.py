"""The rows of `ghostgpu doctor` and how they are shown: a table for a person, JSON for CI."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

Status = Literal["ok", "warn", "fail", "skip"]


class Row(BaseModel):
    """One prerequisite: what was looked at, what was found and, when it is not ok, the fix."""

    check: str
    status: Status
    found: str
    fix: str = ""


def ok(check: str, found: str) -> Row:
    return Row(check=check, status="ok", found=found)


def warn(check: str, found: str, fix: str) -> Row:
    return Row(check=check, status="warn", found=found, fix=fix)


def fail(check: str, found: str, fix: str) -> Row:
    return Row(check=check, status="fail", found=found, fix=fix)


def skip(check: str, found: str) -> Row:
    return Row(check=check, status="skip", found=found)


def exit_code(rows: Sequence[Row]) -> int:
    """1 when any prerequisite fails (warnings do not fail CI), else 0."""
    return 1 if any(r.status == "fail" for r in rows) else 0


def as_json(rows: Sequence[Row]) -> str:
    return json.dumps([r.model_dump() for r in rows], indent=2, sort_keys=True)


_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def print_table(rows: Sequence[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ghostgpu doctor", show_lines=True)
    for col in ("check", "status", "found", "fix"):
        table.add_column(col, overflow="fold", no_wrap=col in ("check", "status"))
    for r in rows:
        table.add_row(r.check, f"[{_STYLE[r.status]}]{r.status}[/]", r.found, r.fix or "-")
    Console(width=max(Console().width, 120)).print(table)
