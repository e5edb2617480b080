"""Turn every way a ghostgpu.yaml can be wrong into one readable line per problem.

Each line reads `FILE: KEY.PATH: what was expected (line N)`. The key path uses the spelling of
the YAML file (camelCase keys, `[i]` list indexes), and the line number comes from the YAML node
tree, so an operator can jump straight to the offending key.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

PathPart = str | int


@dataclass(frozen=True, order=True)
class ConfigIssue:
    """One problem in the config file: where it is and what was expected."""

    path: str
    message: str
    line: int | None = None

    def format(self, source: str) -> str:
        where = f" (line {self.line})" if self.line else ""
        path = f"{self.path}: " if self.path else ""
        return f"{source}: {path}{_bounded(self.message)}{where}"


@dataclass
class ConfigError(Exception):
    """The config file is unusable; `issues` lists every problem found (never empty). `fix` says
    how to give a usable one; without it, `fix_line` words one from the kind of problem."""

    source: str
    issues: list[ConfigIssue] = field(default_factory=list)
    fix: str | None = None

    def lines(self) -> list[str]:
        return [issue.format(self.source) for issue in self.issues]

    def fix_line(self) -> str:
        if self.fix:
            return f"fix: {self.fix}"
        messages = [i.message for i in self.issues]
        if any(m.startswith("cannot read file") for m in messages):
            return f"fix: give the path of a readable file ({self.source} cannot be read as it is)"
        if any(m.startswith(("invalid YAML", "YAML aliases")) for m in messages):
            return f"fix: correct the YAML of {self.source} at the line shown; nothing was written or changed"
        keys = "key" if len(self.issues) == 1 else f"{len(self.issues)} keys"
        return (
            f"fix: correct the {keys} named above in {self.source} (examples/ghostgpu.yaml shows "
            "every section); nothing was written or changed"
        )

    def __str__(self) -> str:
        return "\n".join(self.lines())


# Longer keys are shortened in messages: an error names the key, it does not echo a huge one back.
MAX_KEY_IN_MESSAGE = 80


# Longer messages are cut: the checks echo offending values back ("got '...'"), one place bounds them.
MAX_MESSAGE = 1000


def _shortened(text: str) -> str:
    return f"{text[:40]}…({len(text):,} characters)"


def _bounded(message: str) -> str:
    """The message with each over-long word (a huge value echoed back) shortened, and cut at
    MAX_MESSAGE characters overall."""
    if len(message) <= MAX_KEY_IN_MESSAGE:
        return message
    words = message.split(" ")
    message = " ".join(_shortened(w) if len(w) > MAX_KEY_IN_MESSAGE else w for w in words)
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}…({len(message):,} characters)"
    return message


def format_path(parts: Sequence[PathPart]) -> str:
    """('teams', 1, 'quota', 'h100') -> 'teams[1].quota.h100'; odd keys are quoted."""
    out = ""
    for part in parts:
        if isinstance(part, str) and len(part) > MAX_KEY_IN_MESSAGE:
            part = _shortened(part)
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("-", "").replace("_", "").isalnum():
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys: PyYAML would silently keep the last one."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # PyYAML lets a few scalars escape as bare ValueErrors (a date such as 2026-13-45, an
        # integer over Python's 4,300-digit limit): make them YAML errors with their line.
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            value = str(node.value)
            shown = repr(value) if len(value) <= MAX_KEY_IN_MESSAGE else _shortened(value)
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read the value {shown}: {exc}", node.start_mark
            ) from None


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first defined on line {seen[key] + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

# A cluster file of any real size expands to a few thousand nodes; this bound stops an alias bomb
# (k lines of anchors expanding to 10^k nodes) before anything walks the expanded tree.
MAX_EXPANDED_NODES = 100_000


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes the document has once every alias is expanded (linear in the composed graph)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once instead of looping forever
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, memo) for item in node.value)
    memo[id(node)] = size
    return size


@dataclass
class ParsedYaml:
    data: Any
    lines: dict[tuple[PathPart, ...], int]

    def line_of(self, parts: Sequence[PathPart]) -> int | None:
        """Line of the deepest existing node on the path (1-based)."""
        parts = tuple(parts)
        while parts:
            if parts in self.lines:
                return self.lines[parts]
            parts = parts[:-1]
        return None


def parse_yaml(text: str, source: str) -> ParsedYaml:
    """Parse one YAML document, recording the line of every key and list item."""
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None and (size := _expanded_size(node, {})) > MAX_EXPANDED_NODES:
                raise ConfigError(
                    source,
                    [
                        ConfigIssue(
                            "",
                            f"YAML aliases expand to {size:,} nodes (at most {MAX_EXPANDED_NODES:,}): "
                            "write the values out or use fewer nested aliases",
                            node.start_mark.line + 1,
                        )
                    ],
                )
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(source, [ConfigIssue("", f"invalid YAML: {problem}", line)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [ConfigIssue("", f"invalid YAML: {exc}")]) from None
    lines: dict[tuple[PathPart, ...], int] = {}
    if node is not None:
        _index_lines(node, (), lines)
    return ParsedYaml(data, lines)


def _index_lines(node: yaml.Node, path: tuple[PathPart, ...], out: dict[tuple[PathPart, ...], int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                child = (*path, key_node.value)
                out[child] = key_node.start_mark.line + 1
                _index_lines(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            out[child] = item.start_mark.line + 1
            _index_lines(item, child, out)


def issues_from_validation(
    exc: ValidationError, root: type[BaseModel], parsed: ParsedYaml | None
) -> list[ConfigIssue]:
    """One ConfigIssue per pydantic error, with YAML paths and friendlier wording."""
    issues = []
    for err in exc.errors(include_url=False):
        loc = [part for part in err["loc"] if not _is_internal_loc(part)]
        if parsed is not None and loc and tuple(loc) not in parsed.lines and _is_scalar_at(parsed, loc[:-1]):
            # A shorthand scalar (`h100: 4` for `h100: {nominalQuota: 4}`) is reported where it is.
            loc = loc[:-1]
        issues.append(
            ConfigIssue(
                format_path(loc),
                _message(err, root, loc),
                parsed.line_of(loc) if parsed else None,
            )
        )
    return sorted(set(issues), key=lambda i: (i.line or 0, i.path, i.message))


def _is_scalar_at(parsed: ParsedYaml, loc: Sequence[PathPart]) -> bool:
    value: Any = parsed.data
    for part in loc:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return False
    return _is_scalar(value) and bool(loc)


def _is_internal_loc(part: PathPart) -> bool:
    # pydantic adds union-member / validator tags such as "function-after[...]" to loc.
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def _message(err: Any, root: type[BaseModel], loc: list[PathPart]) -> str:
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(root, loc[:-1])
        key = loc[-1] if loc else "?"
        hint = ""
        if allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; allowed keys: {', '.join(allowed)}"
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    msg = msg.replace("Input should be", "expected").replace("input should be", "expected")
    if kind.startswith(("quantity_", "duration_")):
        return msg
    if _is_scalar(value) and kind not in ("value_error", "assertion_error"):
        msg += f", got {value!r}"
    return msg


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


def _allowed_keys(root: type[BaseModel], loc: Iterable[PathPart]) -> list[str]:
    """Walk the model classes along loc and list the YAML keys accepted at that point."""
    current: Any = root
    for part in loc:
        current = _unwrap_optional(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field_info = next(
                (f for name, f in current.model_fields.items() if part in (name, f.alias)),
                None,
            )
            if field_info is None:
                return []
            current = field_info.annotation
        else:
            args = typing.get_args(current)
            origin = typing.get_origin(current)
            if origin in (list, tuple) and args:
                current = args[0]
            elif origin is dict and len(args) == 2:
                current = args[1]
            else:
                return []
    current = _unwrap_optional(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(f.alias or name for name, f in current.model_fields.items())
    return []


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    if typing.get_origin(tp) is typing.Annotated:
        return typing.get_args(tp)[0]
    return tp
