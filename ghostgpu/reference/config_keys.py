"""docs/reference/config.md: every ghostgpu.yaml key (path, type, default, description), walked from
the pydantic models of ghostgpu.config with their field information. A key without a description
stops the generator: every key the file takes is explained."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ghostgpu import config as c
from ghostgpu.image_ref import validate_image_ref
from ghostgpu.quantity import Duration, Quantity
from ghostgpu.reference import header
from ghostgpu.reference.markdown import cell, code, table

# The validated string types of ghostgpu.config, by the validator that defines them.
_VALIDATED = {
    c._dns_label: "DNS-1123 label",
    c._extended_resource: "extended resource name",
    c._label_map: "map of Kubernetes labels",
    c._device_class_name: "DeviceClass name",
    c._kueue_resource_name: "Kueue resource name",
    c._query_template: "PromQL template",
    c._program_names: "list of program names",
    validate_image_ref: "image reference",
}
_SCALARS = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
    Duration: "duration",
    Quantity: "quantity",
}


@dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str
    description: str


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        if len(rest) < len(args) and len(rest) == 1:
            return rest[0], True
    return annotation, False


def _model_of(annotation: Any) -> type[BaseModel] | None:
    annotation, _ = _strip_optional(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _bounds(metadata: list[Any]) -> str:
    out = []
    for m in metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(m, attr, None)
            if isinstance(m, getattr(annotated_types, attr.capitalize())) and value is not None:
                out.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
        if isinstance(m, annotated_types.MinLen) and m.min_length:
            out.append(f"at least {m.min_length}")
    return ", ".join(out)


def type_name(annotation: Any, metadata: list[Any] | None = None, top: bool = True) -> str:
    """A reader's name for an annotation: `list of DNS-1123 label`, `one of shadow, enforce`, ..."""
    metadata = list(metadata or [])
    annotation, optional = _strip_optional(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        metadata += extra
        annotation = base
    named = next((_VALIDATED[v.func] for v in metadata if getattr(v, "func", None) in _VALIDATED), None)
    origin = typing.get_origin(annotation)
    if named:
        name = named
    elif origin is Literal:
        name = "one of " + ", ".join(f"`{v}`" for v in typing.get_args(annotation))
    elif origin is list:
        name = "list of " + type_name(typing.get_args(annotation)[0], top=False)
    elif origin is dict:
        key, value = typing.get_args(annotation)
        name = f"map of {type_name(key, top=False)} to {type_name(value, top=False)}"
    elif origin in (typing.Union, types.UnionType):
        name = " or ".join(type_name(a, top=top) for a in typing.get_args(annotation))
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        name = "section" if top else "object"
    else:
        name = _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))
    bounds = _bounds(metadata)
    if bounds:
        name += f" ({bounds})"
    return name + (" or null" if optional else "")


def _show(field: FieldInfo, value: Any) -> str:
    dumped = TypeAdapter(field.annotation).dump_python(value, mode="json", by_alias=True)
    if isinstance(dumped, dict) and any(isinstance(v, dict) for v in dumped.values()):
        # A table of objects (the action classes): its entries' names; their keys follow.
        return "entries " + ", ".join(code(k) for k in dumped)
    if isinstance(dumped, str):
        return code(dumped) if dumped else '`""`'
    return code(json.dumps(dumped, ensure_ascii=False, separators=(", ", ": ")))


def _default(field: FieldInfo, parent: BaseModel | None, name: str) -> tuple[Any, str]:
    """(the effective default value or None, how the page shows it). A field of a section that has a
    default takes that section's value: controller.metrics.dcgm's queries are the dcgm preset's."""
    if parent is not None:
        value = getattr(parent, name)
    elif field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    else:
        return None, "required"
    return value, _show(field, value)


def _description(model: type[BaseModel], field: FieldInfo, path: str) -> str:
    if not field.description:
        raise ValueError(f"{path} ({model.__name__}) has no description: give it Field(description=...)")
    text = " ".join(field.description.split())
    return text[:1].upper() + text[1:]


def _item(annotation: Any) -> Any:
    annotation, _ = _strip_optional(annotation)
    origin = typing.get_origin(annotation)
    if origin is list:
        return typing.get_args(annotation)[0]
    if origin is dict:
        return typing.get_args(annotation)[1]
    return None


def all_keys(
    model: type[BaseModel] = c.GhostgpuConfig, prefix: str = "", instance: BaseModel | None = None
) -> Iterator[Key]:
    """Every key under `model`, depth first in the models' field order. `instance` is the section's
    default value when it has one (its fields' defaults are read from it)."""
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}.{key}" if prefix else key
        sub = _model_of(field.annotation)
        value, shown = _default(field, instance, name)
        if sub is not None:
            shown = "—" if value is not None else shown
        yield Key(path, type_name(field.annotation, field.metadata), shown, _description(model, field, path))
        if sub is not None:
            yield from all_keys(sub, path, value if isinstance(value, sub) else None)
            continue
        item = _item(field.annotation)
        item_model = _model_of(item) if item is not None else None
        if item_model is not None:
            annotation, _ = _strip_optional(field.annotation)
            child = f"{path}[]" if typing.get_origin(annotation) is list else f"{path}.<key>"
            yield from all_keys(item_model, child)


def page() -> str:
    out = [header("ghostgpu.yaml keys", "the pydantic models of ghostgpu/config.py")]
    out.append(
        "\nEvery key `ghostgpu render` and the other commands accept, with its type, its default and "
        "what it does. Keys are camelCase; an unknown key is an error that names it and its line. "
        "`a[]` is every element of the list `a`, `a.<key>` every entry of the map `a`. A default of "
        "`—` marks a section (its keys follow it); `required` a key without a default. The "
        "controller reads the `controller` section from its ConfigMap, rendered from this file. "
        "[render.md](../render.md) shows a whole file; examples/ghostgpu.yaml is the one a new "
        "render starts from.\n"
    )
    rows: dict[str, list[list[str]]] = {}
    found = list(all_keys())
    sections = {k.path.split(".")[0].split("[")[0] for k in found if k.path != k.path.split(".")[0]}
    sections |= {k.path.split("[")[0] for k in found if "[]" in k.path}
    for k in found:
        top = k.path.split(".")[0].split("[")[0]
        rows.setdefault(top if top in sections else "top level", []).append(
            [code(k.path), cell(k.type), k.default, cell(k.description)]
        )
    for section, section_rows in rows.items():
        out.append(f"\n## {section}\n\n")
        out.append(table(["key", "type", "default", "description"], section_rows))
    return "".join(out)
