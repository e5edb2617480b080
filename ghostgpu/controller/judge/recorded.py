"""The verdict a workload carries from an earlier poll (its `ghostgpu.io/verdict` and evidence
annotations): what the judge compares a new verdict to, what the act room rewrites, what the books
count a workload not judged this poll as."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence

from ghostgpu.controller import keys
from ghostgpu.controller.inventory import PodView, Workload
from ghostgpu.controller.judge.planner import silent_first
from ghostgpu.verdict import Verdict, VerdictKind


def recorded(wl: Workload, pods: Sequence[PodView] = ()) -> Mapping[str, str]:
    """Where the last verdict was written: the workload, or its pods when the workload could not
    be written (see kube.AdmissionDenied)."""
    if keys.VERDICT in wl.annotations:
        return wl.annotations
    for pod in sorted(pods, key=lambda p: p.name):
        if keys.VERDICT in pod.annotations:
            return pod.annotations
    return wl.annotations


def verdict_of(wl: Workload | Mapping[str, str]) -> VerdictKind | None:
    annotations = wl.annotations if isinstance(wl, Workload) else wl
    raw = annotations.get(keys.VERDICT)
    try:
        return VerdictKind(raw) if raw else None
    except ValueError:
        return None


def reasons_changed(recorded: Mapping[str, str], verdict: Verdict) -> bool:
    """Annotations follow the reasons too (ACTIVE busy -> ACTIVE in a batch gap is worth seeing);
    never for a warm-up UNKNOWN (Verdict.warming_up), and never onto a workload that carries no
    verdict while it is plainly busy (not written: planner.silent_first)."""
    if verdict.warming_up:
        return False
    if keys.VERDICT not in recorded and silent_first(verdict, None):
        return False
    return _parse_reasons(recorded.get(keys.EVIDENCE, "")) != list(verdict.reasons)


@functools.lru_cache(maxsize=32768)
def _parse_reasons(evidence: str) -> list[str] | None:
    """The reasons recorded in an evidence annotation. Memoised on the annotation text: it changes
    only when the controller rewrites it, so most polls parse none of the N annotations (the
    annotation stays the durable record; callers only compare the result, never mutate it)."""
    try:
        reasons = json.loads(evidence).get("reasons")
    except (ValueError, AttributeError):
        return None
    return reasons if isinstance(reasons, list) else None
