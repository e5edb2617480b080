"""A thin synchronous client for the devcluster's own set-up: server-side apply of manifests and a
few waits. Tests and the controller use their own clients (kr8s) against the same kubeconfig."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

FIELD_MANAGER = "ghostgpu-devcluster"
# Kyverno's and Kueue's CRDs are ~9 MB of YAML: libyaml parses them >10x faster than pure Python.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_docs(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """All non-empty YAML documents of the given files, in file order."""
    docs: list[dict[str, Any]] = []
    for p in paths:
        for doc in yaml.load_all(p.read_text(), Loader=_LOADER):
            if doc:
                if not isinstance(doc, dict) or "kind" not in doc:
                    raise ValueError(f"{p}: every YAML document must be a Kubernetes object with a kind")
                docs.append(doc)
    return docs


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self._dyn: DynamicClient | None = None

    @property
    def dyn(self) -> DynamicClient:
        if self._dyn is None:
            # A per-cluster discovery cache: a stale global one would hide freshly installed CRDs.
            cache = self.kubeconfig.parent / "discovery-cache.json"
            cache.unlink(missing_ok=True)
            self._dyn = DynamicClient(self.api_client, cache_file=str(cache))
        return self._dyn

    def refresh_discovery(self) -> None:
        self._dyn = None

    def resource(self, api_version: str, kind: str) -> Any:
        try:
            return self.dyn.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            self.refresh_discovery()
            return self.dyn.resources.get(api_version=api_version, kind=kind)

    def apply(self, doc: dict[str, Any], field_manager: str = FIELD_MANAGER, dry_run: bool = False) -> Any:
        """Server-side apply one object (force: the devcluster owns what it applies). With dry_run
        the apiserver validates, defaults and admits it as usual but stores nothing."""
        res = self.resource(doc["apiVersion"], doc["kind"])
        return self.dyn.server_side_apply(
            res,
            body=doc,
            namespace=doc.get("metadata", {}).get("namespace"),
            field_manager=field_manager,
            force_conflicts=True,
            dry_run="All" if dry_run else None,
        )

    def apply_all(self, docs: Iterable[dict[str, Any]], field_manager: str = FIELD_MANAGER) -> None:
        for d in docs:
            self.apply(d, field_manager)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Any | None:
        try:
            return self.resource(api_version, kind).get(name=name, namespace=namespace)
        except NotFoundError:
            return None

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        with contextlib.suppress(NotFoundError):
            self.resource(api_version, kind).delete(name=name, namespace=namespace)

    def wait_crds_established(self, names: Iterable[str], timeout: float = 60) -> None:
        ext = client.ApiextensionsV1Api(self.api_client)
        pending = set(names)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for n in sorted(pending):
                crd = ext.read_custom_resource_definition(n)
                conds = {c.type: c.status for c in (crd.status.conditions or [])}
                if conds.get("Established") == "True":
                    pending.discard(n)
            if pending:
                time.sleep(0.2)
        if pending:
            raise TimeoutError(f"CRDs not Established after {timeout:.0f}s: {sorted(pending)}")
        self.refresh_discovery()
