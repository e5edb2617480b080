"""Bad ghostgpu.yaml: one clear line per problem, `FILE: key.path: what was expected (line N)`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ghostgpu.config import load_config, load_config_text, load_controller_config
from ghostgpu.config_errors import ConfigError, format_path

GOOD = """\
flavors:
  - name: h100
    resource: nvidia.com/gpu
  - name: mig-1g
    resource: nvidia.com/mig-1g.10gb
cohorts:
  - name: pool
teams:
  - name: research
    cohort: pool
    quota:
      h100: {nominalQuota: 4, borrowingLimit: 2}
  - name: serving
    quota:
      h100: 2
      mig-1g: 7
namespaces:
  - {name: research-batch, team: research}
"""


def errors(text: str, source: str = "cluster.yaml") -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, source)
    lines = info.value.lines()
    assert lines, "a ConfigError always names at least one problem"
    assert all(line.startswith(f"{source}: ") for line in lines)
    return lines


def test_good_config_loads() -> None:
    cfg = load_config_text(GOOD)
    assert [t.name for t in cfg.teams] == ["research", "serving"]


def test_invalid_yaml_names_the_line() -> None:
    text = GOOD.replace("    cohort: pool\n", "    cohort: [pool\n")
    [line] = errors(text)
    assert line.startswith("cluster.yaml: invalid YAML: ")
    assert "(line 11)" in line


def test_duplicate_yaml_key_is_an_error_not_silently_merged() -> None:
    text = GOOD.replace("    cohort: pool\n", "    cohort: pool\n    cohort: other\n")
    [line] = errors(text)
    assert "duplicate key 'cohort' (first defined on line 10)" in line
    assert "(line 11)" in line


def test_unknown_key_suggests_the_right_one() -> None:
    text = GOOD.replace("borrowingLimit", "borrowLimit")
    [line] = errors(text)
    assert line == (
        "cluster.yaml: teams[0].quota.h100.borrowLimit: unknown key; did you mean 'borrowingLimit'? (line 12)"
    )


def test_unknown_top_level_key_lists_nothing_misleading() -> None:
    [line] = errors(GOOD + "flavours: []\n")
    assert line.startswith("cluster.yaml: flavours: unknown key; did you mean 'flavors'?")


def test_wrong_type() -> None:
    [line] = errors(GOOD + "controller:\n  window: five\n")
    assert line.startswith("cluster.yaml: controller.window: expected a valid integer")
    assert "got 'five'" in line


def test_negative_quantity_is_reported_at_the_shorthand_key() -> None:
    [line] = errors(GOOD.replace("      h100: 2\n", "      h100: -2\n"))
    assert line == "cluster.yaml: teams[1].quota.h100: expected a non-negative quantity, got '-2' (line 15)"


def test_unparsable_quantity() -> None:
    [line] = errors(GOOD.replace("mig-1g: 7", "mig-1g: seven"))
    assert line == (
        "cluster.yaml: teams[1].quota.mig-1g: expected a Kubernetes quantity such as 8, 500m or 10Gi, "
        "got 'seven' (line 16)"
    )


def test_fractional_device_count() -> None:
    [line] = errors(GOOD.replace("mig-1g: 7", "mig-1g: 500m"))
    assert "teams[1].quota.mig-1g.nominalQuota: expected a whole number of devices, got '500m'" in line


def test_reference_to_undefined_flavor() -> None:
    [line] = errors(GOOD.replace("      mig-1g: 7\n", "      a100: 7\n"))
    assert line == (
        "cluster.yaml: teams[1].quota.a100: undefined flavor 'a100'; defined flavors: h100, mig-1g (line 16)"
    )


def test_reference_to_undefined_team() -> None:
    [line] = errors(GOOD.replace("team: research}", "team: reserch}"))
    assert line == (
        "cluster.yaml: namespaces[0].team: undefined team 'reserch'; "
        "defined teams: research, serving (line 18)"
    )


def test_reference_to_undefined_cohort() -> None:
    [line] = errors(GOOD.replace("cohort: pool", "cohort: pol"))
    assert line == "cluster.yaml: teams[0].cohort: undefined cohort 'pol'; defined cohorts: pool (line 10)"


def test_duplicate_names() -> None:
    text = GOOD.replace("  - name: serving\n", "  - name: research\n")
    [line] = errors(text)
    assert line == "cluster.yaml: teams[1].name: duplicate name 'research' (first used at teams[0]) (line 13)"


def test_non_dns_1123_names() -> None:
    lines = errors(GOOD.replace("name: h100", "name: H100_x").replace("name: research-batch", "name: -batch"))
    assert len(lines) == 2
    assert lines[0].startswith("cluster.yaml: flavors[0].name: expected a DNS-1123 label")
    assert "got 'H100_x' (line 2)" in lines[0]
    assert lines[1].startswith("cluster.yaml: namespaces[0].name: expected a DNS-1123 label")


def test_borrowing_limit_without_cohort() -> None:
    [line] = errors(GOOD.replace("      h100: 2\n", "      h100: {nominalQuota: 2, borrowingLimit: 1}\n"))
    assert line == (
        "cluster.yaml: teams[1].quota.h100.borrowingLimit: borrowingLimit needs the team to be in a cohort "
        "(set teams[1].cohort) (line 15)"
    )


def test_lending_limit_above_nominal_quota() -> None:
    [line] = errors(GOOD.replace("borrowingLimit: 2", "lendingLimit: 5"))
    assert "teams[0].quota.h100.lendingLimit: lendingLimit (5) cannot exceed nominalQuota (4)" in line


def test_borrow_within_cohort_conflicts_with_fair_sharing() -> None:
    text = GOOD.replace(
        "    cohort: pool\n",
        "    cohort: pool\n"
        "    preemption: {reclaimWithinCohort: Any, borrowWithinCohort: {policy: LowerPriority}}\n",
    )
    [line] = errors(text)
    assert (
        "teams[0].preemption.borrowWithinCohort.policy: borrowWithinCohort works only with classical" in line
    )
    # With classical preemption the same team is fine.
    load_config_text(text + "kueue:\n  fairSharing: {enabled: false}\n")


def test_every_problem_is_reported_once() -> None:
    text = GOOD.replace("cohort: pool", "cohort: nowhere").replace("mig-1g: 7", "gpu-x: 7")
    text = text.replace("team: research}", "team: nobody}")
    lines = errors(text)
    assert len(lines) == 3
    assert [line.split(": ")[1] for line in lines] == [
        "teams[0].cohort",
        "teams[1].quota.gpu-x",
        "namespaces[0].team",
    ]


def test_structural_errors_are_all_reported_together() -> None:
    text = (
        GOOD.replace("name: h100", "name: H100").replace("mig-1g: 7", "mig-1g: x")
        + "controller: {mode: yolo}\n"
    )
    lines = errors(text)
    assert len(lines) == 3
    assert any("controller.mode: expected 'shadow' or 'enforce', got 'yolo'" in line for line in lines)


def test_top_level_must_be_a_mapping() -> None:
    [line] = errors("- a\n- b\n")
    assert "expected a mapping at the top level" in line


def test_missing_required_sections() -> None:
    lines = errors("apiVersion: ghostgpu.io/v1alpha1\n")
    assert "cluster.yaml: flavors: required key is missing" in lines[0]
    assert "cluster.yaml: teams: required key is missing" in lines[1]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.yaml")
    assert "cannot read file" in str(info.value)


def test_load_controller_config_reports_with_its_own_paths(tmp_path: Path) -> None:
    path = tmp_path / "ghostgpu-controller.yaml"
    path.write_text("mode: enforce\npollInterval: soon\n")
    with pytest.raises(ConfigError) as info:
        load_controller_config(path)
    [line] = info.value.lines()
    assert line == f"{path}: pollInterval: expected a duration such as 30s, 5m or 1h30m, got 'soon' (line 2)"


@pytest.mark.parametrize(
    ("parts", "text"),
    [
        (("teams", 1, "quota", "h100"), "teams[1].quota.h100"),
        (("teams", 0, "namespaceQuota", "mig-1g"), "teams[0].namespaceQuota.mig-1g"),
        (
            ("flavors", 0, "nodeLabels", "nvidia.com/gpu.product"),
            'flavors[0].nodeLabels["nvidia.com/gpu.product"]',
        ),
    ],
)
def test_format_path(parts: tuple[str | int, ...], text: str) -> None:
    assert format_path(parts) == text


def test_format_path_shortens_a_huge_key() -> None:
    text = format_path(("controller", "9" * 19_701))
    assert text == 'controller["' + "9" * 40 + '…(19,701 characters)"]'


def test_kueue_framework_names_are_checked() -> None:
    [line] = errors(
        GOOD + "kueue:\n  frameworks: [batch/job, pod, deployment, statefulset, kubeflow.org/pytorchjobs]\n"
    )
    assert line.startswith(
        "cluster.yaml: kueue.frameworks: unknown Kueue framework(s) 'kubeflow.org/pytorchjobs'"
    )
    [line] = errors(GOOD + "kueue:\n  frameworks: [batch/job, pod]\n")
    assert line == (
        "cluster.yaml: kueue.frameworks: "
        "expected pod, deployment and statefulset among the frameworks (line 20)"
    )


def test_fair_sharing_strategies_must_be_a_list_kueue_accepts() -> None:
    text = (
        GOOD
        + "kueue:\n  fairSharing:\n"
        + "    preemptionStrategies: [LessThanInitialShare, LessThanOrEqualToFinalShare]\n"
    )
    [line] = errors(text)
    assert line.startswith("cluster.yaml: kueue.fairSharing.preemptionStrategies: expected one of")
    load_config_text(GOOD + "kueue:\n  fairSharing:\n    preemptionStrategies: [LessThanInitialShare]\n")


def test_a_huge_value_is_not_echoed_back_in_full() -> None:
    # Found by the fuzz suite: a 20,000-character apiVersion came back whole in "got '...'".
    [line] = errors('apiVersion: "' + "9" * 19_950 + '"\n' + GOOD)
    assert line.startswith("cluster.yaml: apiVersion: expected 'ghostgpu.io/v1alpha1', got '99")
    assert "…(19,952 characters) (line 1)" in line and len(line) < 200
    words = " ".join(["word"] * 600)  # long through many short words: cut as a whole
    [line] = errors(f"apiVersion: {words}\n" + GOOD)
    assert line.endswith("…(3,038 characters) (line 1)") and len(line) < 1_100


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("2026-13-45", "'2026-13-45': month must be in 1..12"),
        ("9" * 5_000, "9" * 40 + "…(5,000 characters): "),
    ],
)
def test_a_value_yaml_cannot_construct_is_a_clear_error_not_a_crash(value: str, shown: str) -> None:
    # PyYAML raises a bare ValueError for these (a date out of range, an int over 4,300 digits).
    [line] = errors(GOOD.replace("cohorts:\n", f"cohorts:\n  - name: {value}\n", 1))
    assert (
        line.startswith(f"cluster.yaml: invalid YAML: cannot read the value {shown}") and "(line 7)" in line
    )


def test_the_controller_file_names_the_gitops_key_at_its_own_path(tmp_path: Path) -> None:
    path = tmp_path / "ghostgpu-controller.yaml"
    path.write_text("mode: enforce\ngitops:\n  orphanMarkers: remote\n")
    with pytest.raises(ConfigError) as info:
        load_controller_config(path)
    [line] = info.value.lines()
    assert line == f"{path}: gitops.orphanMarkers: expected 'escalate' or 'stale', got 'remote' (line 3)"
    path.write_text("gitops:\n  orphanMarker: stale\n")  # a typo is an unknown key, not a default
    with pytest.raises(ConfigError) as info:
        load_controller_config(path)
    assert "gitops.orphanMarker" in info.value.lines()[0]
