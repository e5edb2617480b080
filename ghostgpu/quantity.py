"""Kubernetes quantities ("8", "500m", "10Gi", "1e3") and Go-style durations ("90s", "1h30m").

Both are kept as the string the user wrote (so rendered manifests show the same spelling) and
expose their numeric value. Parsing is strict: anything Kubernetes or Go would reject is rejected
here, so a bad value fails at `ghostgpu render` instead of at `kubectl apply`.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
# Same grammar as k8s.io/apimachinery resource.ParseQuantity: signed decimal number, then
# a binary SI suffix, a decimal SI suffix, or a decimal exponent.
_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


def parse_quantity(text: str) -> Decimal:
    """Return the value of a Kubernetes quantity; raise ValueError if it is not one."""
    match = _QUANTITY_RE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 8, 500m, 10Gi)")
    number = Decimal(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    try:
        return number * (Decimal(10) ** int(suffix[1:]))
    except (InvalidOperation, ValueError) as exc:  # pragma: no cover - regex guarantees digits
        raise ValueError(f"{text!r} has an invalid exponent") from exc


class Quantity(str):
    """A non-negative Kubernetes quantity, kept in its original spelling.

    YAML integers and floats are accepted and turned into their string form (8 -> "8")."""

    @property
    def value(self) -> Decimal:
        return parse_quantity(self)

    @property
    def is_whole(self) -> bool:
        return self.value == self.value.to_integral_value()

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )

    @classmethod
    def _validate(cls, raw: Any) -> Quantity:
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float, Decimal)):
            raise PydanticCustomError(
                "quantity_type",
                "expected a Kubernetes quantity such as 8, 500m or 10Gi, got {got}",
                {"got": type(raw).__name__},
            )
        text = raw if isinstance(raw, str) else _number_text(raw)
        try:
            value = parse_quantity(text)
        except ValueError:
            raise PydanticCustomError(
                "quantity_parse",
                "expected a Kubernetes quantity such as 8, 500m or 10Gi, got {got}",
                {"got": repr(text)},
            ) from None
        if value < 0:
            raise PydanticCustomError(
                "quantity_negative", "expected a non-negative quantity, got {got}", {"got": repr(text)}
            )
        return cls(text.strip())


def _number_text(raw: int | float | Decimal) -> str:
    if isinstance(raw, float) and raw.is_integer():
        return str(int(raw))
    return str(raw)


_DURATION_RE = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h))+$")
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a Go/Prometheus style duration such as "30s", "5m", "1h30m"."""
    if not isinstance(text, str) or not _DURATION_RE.match(text.strip()):
        raise ValueError(f"{text!r} is not a duration (e.g. 30s, 5m, 1h30m)")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART_RE.findall(text.strip()))


class Duration(str):
    """A positive duration kept in its original spelling ("60s"); `.seconds` gives the value."""

    @property
    def seconds(self) -> float:
        return parse_duration(self)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )

    @classmethod
    def _validate(cls, raw: Any) -> Duration:
        if not isinstance(raw, str):
            raise PydanticCustomError(
                "duration_type",
                "expected a duration string such as 30s, 5m or 1h30m, got {got}",
                {"got": type(raw).__name__},
            )
        try:
            seconds = parse_duration(raw)
        except ValueError:
            raise PydanticCustomError(
                "duration_parse",
                "expected a duration such as 30s, 5m or 1h30m, got {got}",
                {"got": repr(raw)},
            ) from None
        if seconds <= 0:
            raise PydanticCustomError(
                "duration_zero", "expected a positive duration, got {got}", {"got": repr(raw)}
            )
        return cls(raw.strip())
