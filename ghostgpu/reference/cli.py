"""docs/reference/cli.md: every `ghostgpu` command and flag with its help text, walked from the
command tree Typer builds from ghostgpu.cli.app (the same tree that parses the command line)."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import typer
import typer.core

from ghostgpu.reference import header
from ghostgpu.reference.markdown import cell, code, table


def tree() -> Any:
    from ghostgpu.cli import app

    return typer.main.get_command(app)


def _is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def _subcommands(command: Any, name: str) -> list[tuple[str, Any]]:
    ctx = typer.Context(command, info_name=name)
    subs = [(n, command.get_command(ctx, n)) for n in command.list_commands(ctx)]
    return [(n, c) for n, c in subs if c is not None and not c.hidden]


def commands(command: Any, path: tuple[str, ...] = ("ghostgpu",)) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, command) for the root and every subcommand, depth first, in the order `--help` lists them."""
    yield path, command
    if _is_group(command):
        for name, sub in _subcommands(command, path[-1]):
            yield from commands(sub, (*path, name))


def _help(command: Any) -> str:
    text = inspect.cleandoc(command.help or "")
    # Docstrings wrap at the source's width: join lines into paragraphs.
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n") if p.strip())


def _is_option(param: Any) -> bool:
    return isinstance(param, typer.core.TyperOption)


def _default(param: Any) -> str:
    if param.required:
        return "required"
    value: Any = param.default
    if value is None or (_is_option(param) and param.is_flag and value is False and not param.secondary_opts):
        return "—"
    if isinstance(value, bool):
        return code("true" if value else "false")
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = value.as_posix()
    return code(str(value))


_TYPE_NAMES = {int: "integer", float: "number", str: "text", Path: "path", bool: "boolean"}


def _type(param: Any) -> str:
    if _is_option(param) and param.is_flag:
        return "flag"
    annotation = param.type_descriptor.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args and typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = args[0]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "one of " + ", ".join(code(m.value) for m in annotation)
    name = _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))
    bounds = [f"{sign} {v}" for sign, v in (("≥", param.min), ("≤", param.max)) if v is not None]
    return " ".join([name, *bounds])


def _param_rows(command: Any) -> list[list[str]]:
    rows = []
    for param in command.params:
        if param.hidden:
            continue
        if _is_option(param):
            names = ", ".join(code(o) for o in (*param.opts, *param.secondary_opts))
        else:
            names = code(param.name.upper())
        help_text = param.help or ""
        if param.envvar:
            help_text += f" (environment: {param.envvar})"
        rows.append([names, _type(param), _default(param), cell(help_text)])
    return rows


def missing_help() -> list[str]:
    """Commands and options that `--help` would show without a word of explanation."""
    out = []
    for path, command in commands(tree()):
        if not command.help:
            out.append(" ".join(path))
        for param in command.params:
            if not param.hidden and not param.help:
                out.append(f"{' '.join(path)} {param.opts[0]}")
    return out


def page() -> str:
    out = [header("Command line", "the parser of `ghostgpu` (ghostgpu/cli.py and its subcommands)")]
    out.append(
        "\nEvery command and flag, with the help text `ghostgpu COMMAND --help` prints. Options before "
        "a command name belong to `ghostgpu` itself. A failure a command can name ends in its message "
        "and exit 2; `--debug` shows the traceback.\n"
    )
    for path, command in commands(tree()):
        blocks = [f"## {' '.join(path)}"]
        if _help(command):
            blocks.append(_help(command))
        if _is_group(command):
            subs = [name for name, _ in _subcommands(command, path[-1])]
            blocks.append("Commands: " + ", ".join(code(" ".join((*path, s))) for s in subs) + ".")
        rows = _param_rows(command)
        if rows:
            blocks.append(table(["option / argument", "type", "default", "help"], rows).rstrip("\n"))
        out.append("\n" + "\n\n".join(blocks) + "\n")
    return "".join(out)
