"""merge_overrides: how a test changes the devcluster Kueue's Configuration (restart_kueue)."""

from __future__ import annotations

from ghostgpu.devcluster.cluster import merge_overrides

BASE = {
    "waitForPodsReady": {"timeout": "10m", "blockAdmission": True},
    "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare"]},
    "integrations": {"frameworks": ["batch/job", "pod"]},
}


def test_nested_keys_merge_none_removes_and_lists_are_replaced_whole() -> None:
    out = merge_overrides(
        BASE,
        {"waitForPodsReady": {"timeout": "15s", "blockAdmission": False}, "fairSharing": None,
         "integrations": {"frameworks": ["batch/job"]}},
    )  # fmt: skip
    assert out == {
        "waitForPodsReady": {"timeout": "15s", "blockAdmission": False},
        "integrations": {"frameworks": ["batch/job"]},
    }
    assert BASE["waitForPodsReady"] == {"timeout": "10m", "blockAdmission": True}  # not mutated


def test_no_overrides_is_the_base_and_a_missing_key_to_remove_is_fine() -> None:
    assert merge_overrides(BASE, {}) == BASE
    assert merge_overrides(BASE, {"absent": None, "waitForPodsReady": {"timeout": None}}) == {
        **BASE,
        "waitForPodsReady": {"blockAdmission": True},
    }
