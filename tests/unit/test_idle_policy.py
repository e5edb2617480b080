"""controller.idleSessions: the model, its per-team overrides, the Namespace annotation's clamp,
and bad values reported by key and line."""

from __future__ import annotations

import pytest

from ghostgpu.config import load_config_text, load_default_config
from ghostgpu.config_errors import ConfigError
from ghostgpu.idle_policy import AFTER_ANNOTATION, IdleSessionsConfig, SessionClass

GOOD = """\
flavors:
  - name: h100
    resource: nvidia.com/gpu
teams:
  - name: research
    quota:
      h100: 4
  - name: serving
    quota:
      h100: 2
controller:
  idleSessions:
    mode: shadow
    after: 2h
    teams:
      research: {after: 1h, mode: enforce}
"""


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "cluster.yaml")
    return info.value.lines()


def test_off_by_default_and_server_and_other_not_applied() -> None:
    cfg = IdleSessionsConfig()
    assert cfg.mode == "off"
    policy = cfg.for_team("anyone")
    assert policy.mode == "off"
    allowed = {c for c in SessionClass if policy.classes.allows(c)}
    assert allowed == {SessionClass.NOTEBOOK, SessionClass.TERMINAL, SessionClass.MONITOR}


def test_team_overrides_and_file_defaults() -> None:
    idle = load_config_text(GOOD).controller.idle_sessions
    research, serving = idle.for_team("research"), idle.for_team("serving")
    assert (research.mode, research.after_s) == ("enforce", 3600)
    assert (serving.mode, serving.after_s) == ("shadow", 7200)
    assert research.warn_before_s == serving.warn_before_s == 3600  # the file's default
    assert idle.for_team(None).after_s == 7200


def test_example_file_shows_the_section_in_shadow() -> None:
    idle = load_default_config().controller.idle_sessions
    assert idle.mode == "shadow"
    assert idle.classes.server is False


@pytest.mark.parametrize(
    ("value", "after"),
    [("6h", 6 * 3600), ("1m", 30 * 60), ("1000h", 168 * 3600), ("soon", 7200)],
)
def test_namespace_annotation_moves_after_within_bounds(value: str, after: float) -> None:
    base = load_config_text(GOOD).controller.idle_sessions.for_team("serving")
    moved = base.with_namespace({AFTER_ANNOTATION: value})
    assert moved.after_s == after
    assert AFTER_ANNOTATION in moved.note
    if value in ("1m", "1000h"):
        assert "clamped" in moved.note
    if value == "soon":
        assert "not a duration" in moved.note
    assert base.with_namespace({}).after_s == 7200


def test_bad_duration_is_named_by_key_and_line() -> None:
    [line] = errors(GOOD.replace("after: 2h", "after: two hours"))
    assert line == (
        "cluster.yaml: controller.idleSessions.after: expected a duration such as 30s, 5m or 1h30m, "
        "got 'two hours' (line 14)"
    )


def test_unknown_class_is_named_with_the_known_ones() -> None:
    [line] = errors(GOOD + "    classes: {notebooks: true}\n")
    assert line.startswith("cluster.yaml: controller.idleSessions.classes.notebooks: unknown key")
    assert "notebook" in line and "(line 17)" in line


def test_bad_mode_is_named() -> None:
    [line] = errors(GOOD.replace("mode: shadow", "mode: on"))
    assert line.startswith("cluster.yaml: controller.idleSessions.mode: ")
    assert "(line 13)" in line


def test_after_outside_its_bounds_is_an_error() -> None:
    [line] = errors(GOOD.replace("after: 2h", "after: 10m"))
    assert line == (
        "cluster.yaml: controller.idleSessions.after: 10m lies outside afterBounds (30m to 168h) (line 14)"
    )
    [line] = errors(GOOD.replace("after: 1h, mode", "after: 1000h, mode"))
    assert line == (
        "cluster.yaml: controller.idleSessions.teams.research.after: 1000h lies outside afterBounds "
        "(30m to 168h) (line 16)"
    )


def test_undefined_team_is_named() -> None:
    [line] = errors(GOOD.replace("      research: {after", "      reserch: {after"))
    assert line == (
        "cluster.yaml: controller.idleSessions.teams.reserch: undefined team 'reserch'; "
        "defined teams: research, serving (line 16)"
    )


def test_negative_cpu_threshold_is_named() -> None:
    [line] = errors(GOOD + "    cpuBelow: -1\n")
    assert line.startswith("cluster.yaml: controller.idleSessions.cpuBelow: ")
    assert "(line 17)" in line
