"""Does the controller's ServiceAccount hold every right the rendered controller/ bundle grants?

The rules are read from the bundle's Roles and ClusterRoles (no second list): each (verb,
resource) is asked of the apiserver with a SubjectAccessReview for the controller's
ServiceAccount — a SelfSubjectAccessReview would answer for whoever runs doctor, not for the
controller. Where a rule applies follows its binding: a ClusterRoleBinding cluster-wide, a
RoleBinding in its namespace, and the namespaced ClusterRole that Kyverno binds (policies/
generate-namespace-objects.yaml) in each opted-in namespace with a known team."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ghostgpu.config import ControllerConfig
from ghostgpu.doctor.reads import Reads
from ghostgpu.doctor.report import Row, fail, ok, warn

RBAC = "rbac.authorization.k8s.io/v1"
CONTROLLER_LABEL = ("app.kubernetes.io/name", "ghostgpu-controller")
CONCURRENT_REVIEWS = 8


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource, where the bundle grants it ('' namespace: cluster-wide)."""

    namespace: str
    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        res = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.verb} {res}" + (f" in {self.namespace}" if self.namespace else "")


def _rules(role: dict[str, Any]) -> Iterable[tuple[str, str, str]]:
    for rule in role.get("rules") or []:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    yield group, resource, verb


def grants(objects: Sequence[dict[str, Any]], opted_in: Sequence[str]) -> list[Grant]:
    """Every grant of the controller bundle's roles, at the scope of its binding."""
    ours = [
        o
        for o in objects
        if o.get("apiVersion") == RBAC
        and ((o.get("metadata") or {}).get("labels") or {}).get(CONTROLLER_LABEL[0]) == CONTROLLER_LABEL[1]
    ]
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in ours
        if o["kind"] in ("Role", "ClusterRole")
    }
    bound: dict[tuple[str, str, str], list[str]] = {}
    for b in ours:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ns = b["metadata"].get("namespace", "") if b["kind"] == "RoleBinding" else ""
        ref = b["roleRef"]
        key = (ref["kind"], ns if ref["kind"] == "Role" else "", ref["name"])
        bound.setdefault(key, []).append(ns)
    out: set[Grant] = set()
    for key, role in roles.items():
        scopes = bound.get(key, list(opted_in) if key[0] == "ClusterRole" else [])
        for ns in scopes:
            out.update(Grant(ns, g, r, v) for g, r, v in _rules(role))
    return sorted(out)


def _review_spec(g: Grant, ctrl: ControllerConfig) -> dict[str, Any]:
    sa_ns, sa = ctrl.namespace, ctrl.service_account
    resource, _, sub = g.resource.partition("/")
    attrs = {"verb": g.verb, "group": g.group, "resource": resource}
    if sub:
        attrs["subresource"] = sub
    if g.namespace:
        attrs["namespace"] = g.namespace
    return {
        "user": f"system:serviceaccount:{sa_ns}:{sa}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}", "system:authenticated"],
        "resourceAttributes": attrs,
    }


async def check_rbac(
    reads: Reads, objects: Sequence[dict[str, Any]], ctrl: ControllerConfig, opted_in: Sequence[str]
) -> Row:
    wanted = grants(objects, opted_in)
    limit = asyncio.Semaphore(CONCURRENT_REVIEWS)

    async def allowed(g: Grant) -> bool:
        async with limit:
            return bool((await reads.access_review(_review_spec(g, ctrl))).get("allowed"))

    answers = await asyncio.gather(*(allowed(g) for g in wanted))
    denied = [str(g) for g, yes in zip(wanted, answers, strict=True) if not yes]
    who = f"ServiceAccount {ctrl.namespace}/{ctrl.service_account}"
    if denied:
        more = f" and {len(denied) - 8} more" if len(denied) > 8 else ""
        return fail(
            "controller: RBAC",
            f"{who} may not: {', '.join(denied[:8])}{more}",
            "sync the rendered controller/ bundle (rbac.yaml) unchanged; namespaced rights come from "
            "Kyverno's RoleBinding in each opted-in namespace",
        )
    scopes = sorted({g.namespace or "cluster" for g in wanted})
    if not opted_in:
        return warn(
            "controller: RBAC",
            f"{who}: {len(wanted)} grants allowed ({', '.join(scopes)}); namespaced rights not checked: "
            "no opted-in namespace",
            "opt a namespace in to check the rights Kyverno binds there",
        )
    return ok("controller: RBAC", f"{who}: all {len(wanted)} grants allowed ({', '.join(scopes)})")
