"""Apply the rendered GitOps bundles (kueue/, policies/, controller/) to a devcluster the way
ArgoCD syncs them: destination namespaces first, then each bundle's kustomization resources in
order, by server-side apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError

from ghostgpu.devcluster.kube import Kube
from ghostgpu.devcluster.paths import REPO_ROOT

BUNDLES = ("kueue", "policies", "controller")  # the ArgoCD sync-wave order
FIELD_MANAGER = "argocd-controller"


def bundle_docs(bundle: str, root: Path = REPO_ROOT) -> list[dict[str, Any]]:
    """The objects of a rendered bundle, in its kustomization's resource order."""
    base = root / bundle
    kfile = base / "kustomization.yaml"
    if not kfile.is_file():
        raise FileNotFoundError(f"{kfile}: missing; run `ghostgpu render -o {root}`")
    docs: list[dict[str, Any]] = []
    for res in yaml.safe_load(kfile.read_text()).get("resources") or []:
        docs += [d for d in yaml.safe_load_all((base / res).read_text()) if d]
    return docs


def static_namespaces(config: Path = REPO_ROOT / "examples" / "ghostgpu.yaml") -> list[str]:
    cfg = yaml.safe_load(config.read_text()) or {}
    return [str(n["name"]) for n in cfg.get("namespaces") or []]


def apply_bundles(kube: Kube, root: Path = REPO_ROOT) -> dict[str, list[str]]:
    """SSA every bundle object; returns the apiserver's refusals per bundle (empty when accepted)."""
    # ArgoCD creates the destination namespaces (CreateNamespace=true); kueue/ names them.
    for ns in static_namespaces(root / "examples" / "ghostgpu.yaml"):
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, FIELD_MANAGER)
    errors: dict[str, list[str]] = {}
    for bundle in BUNDLES:
        errors[bundle] = []
        for doc in bundle_docs(bundle, root):
            meta = doc.get("metadata", {})
            ref = f"{bundle}: {doc['kind']} {meta.get('namespace', '')}/{meta.get('name')}"
            try:
                kube.apply(doc, FIELD_MANAGER)
            except (ApiException, DynamicApiError, ResourceNotFoundError) as err:
                errors[bundle].append(f"{ref}: {getattr(err, 'body', None) or err}")
    return errors
