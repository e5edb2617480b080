"""Escalation to a person: the Alertmanager-compatible webhook POST (docs/design.md#action).

The controller escalates every action the risk gate did not clear with an Event, the annotation
`ghostgpu.io/escalated` (value: `annotation_value()`) and, when `escalation.webhook_url` is set, a
POST of an Alertmanager v2 alert list (`POST /api/v2/alerts`: a JSON list of alerts, each with
`labels`, `annotations`, `startsAt`). A failed POST must never break the reconcile loop, so the
senders never raise for network or HTTP errors: they return an `EscalationResult`, and the caller
records it (an Event, a metric) and tries again on a later poll. Only asyncio cancellation
propagates, as it must.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import BaseModel, ConfigDict

from ghostgpu.autonomy import Decision, EscalationSettings, WorkloadFacts

ESCALATED_ANNOTATION = "ghostgpu.io/escalated"
ALERT_NAME = "GhostGPUActionEscalated"
ALERTMANAGER_PATH = "/api/v2/alerts"


class EscalationResult(BaseModel):
    """What happened to one webhook POST. `ok` is True only for a 2xx answer."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    url: str | None
    status_code: int | None = None
    error: str | None = None
    skipped: bool = False  # no webhook configured: nothing was sent, nothing failed


def alerts_url(webhook_url: str) -> str:
    """A bare Alertmanager address (`http://am:9093`) gets `/api/v2/alerts`; a URL with a path is
    used as given (any Alertmanager-compatible receiver)."""
    parts = urlsplit(webhook_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"escalation.webhook_url: expected an http(s) URL, got {webhook_url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path=ALERTMANAGER_PATH)
    return urlunsplit(parts)


def _rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("escalation: timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_alerts(
    decision: Decision,
    facts: WorkloadFacts,
    *,
    now: datetime,
    extra_labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The Alertmanager v2 payload for one escalated decision (a list with one alert).

    Labels identify the target and the action so Alertmanager groups and deduplicates repeated
    escalations of the same thing; the numbers and the reason go in annotations, which may change.
    """
    labels = {
        "alertname": ALERT_NAME,
        "severity": "warning",
        "kind": facts.kind,
        "name": facts.name,
        "action": decision.action,
        "verdict": decision.verdict or "",
    }
    if facts.namespace:
        labels["namespace"] = facts.namespace
    labels.update(extra_labels or {})
    target = f"{facts.kind}/{facts.name}" + (f" in {facts.namespace}" if facts.namespace else "")
    annotations = {
        "summary": f"ghostgpu wants to {decision.action} {target} and needs a person to decide",
        "description": decision.reason,
        "score": f"{decision.score:.3f}",
        "tau": f"{decision.tau:.3f}",
        "breakdown": decision.breakdown.explain(),
    }
    # Alertmanager rejects empty label values; drop them rather than send "".
    labels = {k: v for k, v in labels.items() if v}
    return [{"labels": labels, "annotations": annotations, "startsAt": _rfc3339(now)}]


def annotation_value(decision: Decision, *, now: datetime) -> str:
    """Short JSON for the `ghostgpu.io/escalated` annotation (sorted keys: stable diffs)."""
    return json.dumps(
        {
            "action": decision.action,
            "at": _rfc3339(now),
            "score": round(decision.score, 3),
            "tau": round(decision.tau, 3),
            "tauSource": decision.tau_source,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def _result(url: str, response: httpx.Response) -> EscalationResult:
    if response.is_success:
        return EscalationResult(ok=True, url=url, status_code=response.status_code)
    body = response.text[:200].strip()
    return EscalationResult(
        ok=False, url=url, status_code=response.status_code, error=f"HTTP {response.status_code}: {body}"
    )


def _failure(url: str | None, exc: Exception) -> EscalationResult:
    kind = "timeout" if isinstance(exc, httpx.TimeoutException) else type(exc).__name__
    return EscalationResult(ok=False, url=url, error=f"{kind}: {exc}" if str(exc) else kind)


async def send_escalation(
    decision: Decision,
    facts: WorkloadFacts,
    settings: EscalationSettings,
    *,
    now: datetime | None = None,
    client: httpx.AsyncClient | None = None,
) -> EscalationResult:
    """POST the alert (asyncio, for the controller). Never raises for network/HTTP/URL errors."""
    if not settings.webhook_url:
        return EscalationResult(ok=True, url=None, skipped=True)
    url: str | None = None
    try:
        url = alerts_url(settings.webhook_url)
        payload = build_alerts(
            decision, facts, now=now or datetime.now(UTC), extra_labels=settings.extra_labels
        )
        if client is not None:
            response = await client.post(url, json=payload, timeout=settings.timeout_seconds)
        else:
            async with httpx.AsyncClient(timeout=settings.timeout_seconds) as own:
                response = await own.post(url, json=payload)
        return _result(url, response)
    except Exception as exc:  # the contract: never raises; asyncio.CancelledError still does
        return _failure(url, exc)


def send_escalation_sync(
    decision: Decision,
    facts: WorkloadFacts,
    settings: EscalationSettings,
    *,
    now: datetime | None = None,
) -> EscalationResult:
    """Blocking twin of `send_escalation` (CLI, scripts). Never raises for network/HTTP/URL errors."""
    if not settings.webhook_url:
        return EscalationResult(ok=True, url=None, skipped=True)
    url: str | None = None
    try:
        url = alerts_url(settings.webhook_url)
        payload = build_alerts(
            decision, facts, now=now or datetime.now(UTC), extra_labels=settings.extra_labels
        )
        with httpx.Client(timeout=settings.timeout_seconds) as client:
            return _result(url, client.post(url, json=payload))
    except Exception as exc:  # the contract: never raises
        return _failure(url, exc)
