"""docs/managers.md's built-in table against the actuator table: one line per built-in row, with its
group/version, its risk gate action class and base risk, and no line for a row that is gone."""

from __future__ import annotations

from pathlib import Path

from ghostgpu.actuators import POD_CONTROLLERS, builtin_actuators

DOC = Path(__file__).resolve().parents[2] / "docs" / "managers.md"


def table_lines() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## The built-in table", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ")][1:]  # no header
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in rows if not ln.startswith("|---")]


def test_every_builtin_row_has_its_line_with_its_group_action_class_and_risk() -> None:
    lines = table_lines()
    used = set()
    for a in builtin_actuators():
        if a.group_kind in POD_CONTROLLERS:
            [i] = [i for i, ln in enumerate(lines) if ln[0].startswith("Deployment, StatefulSet")]
        else:
            found = [i for i, ln in enumerate(lines) if f"`{a.api_version}`" in ln[0] and a.kind in ln[0]]
            assert len(found) == 1, f"{a.kind} ({a.api_version}): {len(found)} lines in docs/managers.md"
            [i] = found
        used.add(i)
        risk = lines[i][-1]
        if a.stop == "none":
            assert risk == "—", (a.kind, risk)
        else:
            assert risk == f"{a.base_risk:g} (`{a.action_class}`)", (a.kind, risk)
    others = [ln[0] for i, ln in enumerate(lines) if i not in used]
    assert others == ["any other controller owner"], others
