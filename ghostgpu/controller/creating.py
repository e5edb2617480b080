"""Creating an object as the controller: a `stop: create` row's stop and restore objects (Volcano's
Command; actuators.CreateSpec). Cluster (kube.py) has it as `create_object`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ObjectCreator:
    api: Any  # kr8s' API (kube.Cluster's)
    field_manager: str

    async def create_object(self, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST a namespaced object as this field manager; 404 (no CRD, or the namespace went) ->
        NotFound, 400/403/422 (refused: no RBAC, a webhook, the schema) -> AdmissionDenied."""
        from kr8s._exceptions import ServerError

        from ghostgpu.controller.kube import AdmissionDenied, NotFound, status_of

        ns = (obj.get("metadata") or {}).get("namespace", "")
        try:
            async with self.api.call_api(
                "POST",
                version=str(obj.get("apiVersion", "")),
                namespace=ns,
                url=plural,
                params={"fieldManager": self.field_manager},
                content=json.dumps(obj),
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            code = status_of(exc)
            if code == 404:
                raise NotFound(f"{obj.get('kind')}/{ns}: {exc}") from exc
            if code in (400, 403, 422):
                raise AdmissionDenied(f"{obj.get('kind')}/{ns}: {str(exc)[:300]}") from exc
            raise
