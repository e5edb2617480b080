"""PromQL text the config and the signals both write: a source selector's label matchers."""

from __future__ import annotations

from collections.abc import Mapping


def quote(value: str) -> str:
    """`value` as a PromQL double-quoted string literal (backslashes and quotes escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def label_matchers(selector: Mapping[str, str]) -> str:
    """`name=~"regex", ...` in name order: every series must match all of them (a source selector:
    the labels of the scrape that produces the series)."""
    return ", ".join(f"{name}=~{quote(regex)}" for name, regex in sorted(selector.items()))
