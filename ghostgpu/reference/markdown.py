"""Markdown table cells for the generated pages."""

from __future__ import annotations

from collections.abc import Sequence


def cell(text: str) -> str:
    """One table cell: a pipe would end the cell and a newline the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: str) -> str:
    """Inline code that survives backticks inside it (PromQL never has them; Markdown allows it)."""
    text = " ".join(str(text).split())
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
