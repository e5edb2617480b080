"""The only calls `ghostgpu doctor` makes to the apiserver: GETs, and access reviews (a review is
answered, never stored). tests/e2e/test_doctor.py checks the audit log for anything else."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kr8s._exceptions import ServerError

from ghostgpu.controller.kube import status_of

DOCTOR_USER_AGENT_PREFIX = "ghostgpu-doctor/"
SUBJECT_ACCESS_REVIEWS = "subjectaccessreviews"


class Reads:
    def __init__(self, api: Any) -> None:
        self.api = api

    async def get(
        self, version: str, url: str, namespace: str | None = None, params: dict[str, str] | None = None
    ) -> dict[str, Any] | None:
        """The object or list at version/[namespaces/NS/]url; None when it does not exist (404).
        `params`: query parameters of a list (a labelSelector)."""
        try:
            async with self.api.call_api(
                "GET", version=version, namespace=namespace, url=url, params=params
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if status_of(exc) == 404:
                return None
            raise

    async def items(
        self, version: str, url: str, namespace: str | None = None, params: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        body = await self.get(version, url, namespace, params)
        return list((body or {}).get("items") or [])

    async def version(self) -> dict[str, Any]:
        async with self.api.call_api("GET", version="", base="/version") as resp:
            return dict(resp.json())

    async def access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A SubjectAccessReview's status: may spec.user do spec.resourceAttributes?"""
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        async with self.api.call_api(
            "POST", version="authorization.k8s.io/v1", url=SUBJECT_ACCESS_REVIEWS, json=body
        ) as resp:
            return dict(resp.json().get("status") or {})


def lease_age(lease: dict[str, Any] | None, now: datetime | None = None) -> tuple[str | None, float | None]:
    """(holder, seconds since the holder last renewed) of a coordination.k8s.io Lease."""
    spec = (lease or {}).get("spec") or {}
    holder = spec.get("holderIdentity") or None
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    if not holder or not renewed:
        return holder, None
    at = datetime.fromisoformat(renewed.replace("Z", "+00:00"))
    return holder, ((now or datetime.now(UTC)) - at).total_seconds()


def lease_is_live(lease: dict[str, Any] | None, now: datetime | None = None) -> bool:
    """Held, and renewed within its own duration (twice over, for clock skew between machines)."""
    holder, age = lease_age(lease, now)
    duration = float(((lease or {}).get("spec") or {}).get("leaseDurationSeconds") or 15)
    return bool(holder) and age is not None and age <= 2 * duration + 5
