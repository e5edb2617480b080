"""examples/argocd/applicationset.yaml as Argo CD's ApplicationSet controller reads it: the
Applications its list generator produces and the RollingSync step that selects each of them.
Tests check the example with this (the ordering offline, the schema on the devcluster)."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ghostgpu.devcluster.paths import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "argocd" / "applicationset.yaml"
# The only Go template form the example uses: {{ .key }} of a list element.
_FIELD = re.compile(r"\{\{\s*\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def load_example(path: Path = EXAMPLE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _expand(value: Any, params: Mapping[str, Any]) -> Any:
    if isinstance(value, str):

        def field(m: re.Match[str]) -> str:
            if m.group(1) not in params:  # goTemplateOptions: missingkey=error
                raise KeyError(f"template field .{m.group(1)} is not in the element {dict(params)}")
            return str(params[m.group(1)])

        return _FIELD.sub(field, value)
    if isinstance(value, dict):
        return {_expand(k, params): _expand(v, params) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, params) for v in value]
    return value


def generated_applications(appset: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Applications of the list generators, in element order, in the ApplicationSet's namespace."""
    spec = appset["spec"]
    apps: list[dict[str, Any]] = []
    for gen in spec["generators"]:
        for element in gen["list"]["elements"]:
            tmpl = _expand(copy.deepcopy(spec["template"]), element)
            if "{{" in yaml.safe_dump(tmpl):
                raise ValueError(f"template left unexpanded for {element}: only {{{{ .key }}}} is supported")
            meta = {**tmpl["metadata"], "namespace": appset["metadata"]["namespace"]}
            apps.append(
                {
                    "apiVersion": "argoproj.io/v1alpha1",
                    "kind": "Application",
                    "metadata": meta,
                    "spec": tmpl["spec"],
                }
            )
    return apps


def _matches(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    # Argo CD's RollingSync supports In and NotIn (applicationset/progressivesync).
    values = expr.get("values") or []
    if expr["operator"] == "In":
        return labels.get(expr["key"]) in values
    if expr["operator"] == "NotIn":
        return labels.get(expr["key"]) not in values
    raise ValueError(f"RollingSync supports the operators In and NotIn, not {expr['operator']!r}")


def rolling_sync_steps(appset: Mapping[str, Any], apps: list[dict[str, Any]]) -> list[list[str]]:
    """Application names per RollingSync step, in step order: a step selects an Application when
    every matchExpression holds. Argo CD warns about an Application that two steps select (it
    runs in the first), so a correct example lists each Application exactly once."""
    steps = appset["spec"]["strategy"]["rollingSync"]["steps"]
    out: list[list[str]] = [[] for _ in steps]
    for app in apps:
        labels = app["metadata"].get("labels") or {}
        for i, step in enumerate(steps):
            if all(_matches(labels, e) for e in step.get("matchExpressions") or []):
                out[i].append(app["metadata"]["name"])
    return out
