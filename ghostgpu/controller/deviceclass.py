"""Which devices a DeviceClass selects: a strict subset of its CEL selectors (pure: no I/O).

A DeviceClass (resource.k8s.io/v1) selects devices with CEL expressions (`spec.selectors[].cel.
expression`) that the scheduler evaluates with Kubernetes' own CEL environment. The controller does
not embed a CEL engine (cel-python pulls in google-re2, pendulum, lark and jmespath, and would still
lack Kubernetes' DRA environment: its attribute maps and semver library); it understands exactly the
forms NVIDIA's DRA driver ships (`gpu.nvidia.com`, `mig.nvidia.com`) and plain driver tests:

    device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'

An expression is `&&` of comparisons `A == L` or `A != L` (either order), A being `device.driver`,
`device.attributes['<domain>'].<id>` or `device.attributes['<domain>']['<id>']`, L a string
literal ('...' or "...", no escapes), an integer or true/false. Anything else (`||`, parentheses,
functions, capacity, macros) is `Unsupported`: the class's devices are then not counted at all,
never guessed.

Evaluation follows the scheduler (k8s.io/dynamic-resource-allocation cel/compile.go and the
allocator's selectorsMatch): an attribute without a domain belongs to the driver's domain; a
missing attribute is a CEL runtime error; `&&` is false when any side is false, else an error when
any side errs; the class's selectors are tried in order, the first error or false deciding. A
runtime error is `None` here (the scheduler fails the allocation: nothing is known), and so is a
comparison this subset cannot decide for sure (a version attribute, a list attribute, a literal of
another type than the attribute's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from sys import intern
from typing import Any, NamedTuple

Literal = str | int | bool


class Attribute(NamedTuple):
    """One attribute of a ResourceSlice device: its name as published (`type`, or qualified:
    `resource.kubernetes.io/pcieRoot`), the kind of its one value (string, int, bool, version,
    ints, ...; "" when it has not exactly one) and the value."""

    name: str
    kind: str
    value: Any


Attributes = tuple[Attribute, ...]

# Every device of a model publishes the same type, product, architecture and versions: one shared
# Attribute each (a slice is cached for every node; 10,000 nodes of 8 GPUs: 80,000 devices).
_SHARED: dict[Attribute, Attribute] = {}
_MAX_SHARED = 1 << 16


def attributes_of(raw: Mapping[str, Any] | None) -> Attributes:
    """A device's `attributes` map as compact, shared tuples (sorted by name: deterministic)."""
    out: list[Attribute] = []
    for name in sorted(raw or {}):
        given = [(k, v) for k, v in (raw[name] or {}).items() if v is not None]  # type: ignore[index]
        kind, value = given[0] if len(given) == 1 else ("", None)
        if isinstance(value, list):
            value = tuple(value)
        attr = Attribute(intern(str(name)), intern(str(kind)), intern(value) if type(value) is str else value)
        try:
            shared = _SHARED.get(attr)
        except TypeError:  # an unhashable value: not shared, and never compared equal (_compare)
            out.append(attr)
            continue
        if shared is None:
            shared = attr
            if len(_SHARED) < _MAX_SHARED:
                _SHARED[attr] = attr
        out.append(shared)
    return tuple(out)


class Unsupported(ValueError):
    """A selector outside the subset: the class's devices cannot be counted."""


@dataclass(frozen=True, slots=True)
class Comparison:
    domain: str | None  # None: device.driver
    attribute: str
    equal: bool  # == (True) or != (False)
    value: Literal


@dataclass(frozen=True, slots=True)
class ClassSelector:
    """A DeviceClass's selectors, each a conjunction of comparisons."""

    name: str
    selectors: tuple[tuple[Comparison, ...], ...]

    @property
    def driver(self) -> str | None:
        """The driver every selected device has (a selector says `device.driver == 'X'`), else None."""
        for terms in self.selectors:
            for t in terms:
                if t.domain is None and t.equal and isinstance(t.value, str):
                    return t.value
        return None

    def matches(self, driver: str, attributes: Attributes) -> bool | None:
        """Whether the class selects a device of `driver` with these ResourceSlice attributes;
        None: the scheduler's CEL would fail on it (or this subset cannot tell)."""
        for terms in self.selectors:
            errored = False
            for t in terms:
                r = _compare(t, driver, attributes)
                if r is False:
                    break
                errored = errored or r is None
            else:
                if errored:
                    return None
                continue
            return False
        return True


_TOKEN = re.compile(
    r"\s*(?:(?P<str>'[^'\\]*'|\"[^\"\\]*\")|(?P<int>-?\d+)|(?P<op>==|!=|&&)|(?P<punct>[.\[\]])"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))"
)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise Unsupported(f"cannot read {expr[pos:].strip()[:40]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, expr: str) -> None:
        self.toks = _tokens(expr)
        self.i = 0

    def _peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _take(self, kind: str, text: str | None = None) -> str:
        tok = self._peek()
        if tok is None or tok[0] != kind or (text is not None and tok[1] != text):
            got = "the end" if tok is None else repr(tok[1])
            raise Unsupported(f"expected {text or kind}, got {got}")
        self.i += 1
        return tok[1]

    def conjunction(self) -> tuple[Comparison, ...]:
        terms = [self._comparison()]
        while self._peek() == ("op", "&&"):
            self.i += 1
            terms.append(self._comparison())
        if self._peek() is not None:
            raise Unsupported(f"unexpected {self._peek()[1]!r}")  # type: ignore[index]
        return tuple(terms)

    def _comparison(self) -> Comparison:
        tok = self._peek()
        if tok is not None and tok[0] == "ident" and tok[1] == "device":
            domain, attribute = self._access()
            equal = self._take("op")
            value = self._literal()
        else:
            value = self._literal()
            equal = self._take("op")
            domain, attribute = self._access()
        if equal not in ("==", "!="):
            raise Unsupported(f"expected == or !=, got {equal!r}")
        if domain is None and not isinstance(value, str):
            raise Unsupported("device.driver is compared with a string")
        return Comparison(domain, attribute, equal == "==", value)

    def _access(self) -> tuple[str | None, str]:
        self._take("ident", "device")
        self._take("punct", ".")
        field = self._take("ident")
        if field == "driver":
            return None, "driver"
        if field != "attributes":
            raise Unsupported(f"device.{field} is not understood (only driver and attributes)")
        self._take("punct", "[")
        domain = _unquote(self._take("str"))
        self._take("punct", "]")
        if self._peek() == ("punct", "."):
            self.i += 1
            return domain, self._take("ident")
        self._take("punct", "[")
        attribute = _unquote(self._take("str"))
        self._take("punct", "]")
        return domain, attribute

    def _literal(self) -> Literal:
        tok = self._peek()
        if tok is None:
            raise Unsupported("expected a literal, got the end")
        self.i += 1
        kind, text = tok
        if kind == "str":
            return _unquote(text)
        if kind == "int":
            return int(text)
        if kind == "ident" and text in ("true", "false"):
            return text == "true"
        raise Unsupported(f"expected a literal, got {text!r}")


def _unquote(text: str) -> str:
    return text[1:-1]


def parse_expression(expr: str) -> tuple[Comparison, ...]:
    return _Parser(expr).conjunction()


def class_selector(obj: Mapping[str, Any]) -> ClassSelector:
    """A DeviceClass object's selectors; Unsupported when one is outside the subset."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    selectors: list[tuple[Comparison, ...]] = []
    for i, sel in enumerate((obj.get("spec") or {}).get("selectors") or []):
        cel = (sel or {}).get("cel")
        if not cel or not isinstance(cel.get("expression"), str):
            raise Unsupported(f"DeviceClass {name}: selectors[{i}] is not a CEL selector")
        try:
            selectors.append(parse_expression(cel["expression"]))
        except Unsupported as exc:
            raise Unsupported(f"DeviceClass {name}: selectors[{i}]: {exc}") from None
    return ClassSelector(name, tuple(selectors))


@dataclass(frozen=True, slots=True)
class ClassView:
    """What the controller keeps of a DeviceClass: its selectors, or why they are not understood."""

    name: str
    selector: ClassSelector | None
    error: str = ""


def class_view(obj: Mapping[str, Any]) -> ClassView:
    name = str((obj.get("metadata") or {}).get("name", ""))
    try:
        return ClassView(name, class_selector(obj))
    except Unsupported as exc:
        return ClassView(name, None, str(exc))


def _attribute(attributes: Attributes, driver: str, domain: str, name: str) -> Attribute | None:
    """The attribute `<domain>/<name>`; an unqualified attribute is in the driver's domain."""
    qualified = f"{domain}/{name}"
    bare = name if domain == driver else None
    for a in attributes:
        if a.name == qualified or a.name == bare:
            return a
    return None


def _compare(t: Comparison, driver: str, attributes: Attributes) -> bool | None:
    if t.domain is None:
        return (driver == t.value) == t.equal
    attr = _attribute(attributes, driver, t.domain, t.attribute)
    if attr is None:
        return None  # CEL: no such key
    kind, value = attr.kind, attr.value  # kind "": not exactly one value, refused by the scheduler too
    want = {"string": str, "int": int, "bool": bool}.get(kind)
    # bool is an int in Python: compare types exactly.
    if want is None or type(value) is not want or type(t.value) is not want:
        return None
    return (value == t.value) == t.equal
