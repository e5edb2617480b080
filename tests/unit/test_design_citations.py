"""No file cites a design document the repository does not have: code, tests and docs cite the
sections of docs/design.md by their stable anchors, and every cited anchor exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _tracked_text_files() -> list[Path]:
    try:
        names = subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        names = [
            p.relative_to(REPO).as_posix() for p in REPO.rglob("*") if p.is_file() and ".git" not in p.parts
        ]
    out = []
    for name in names:
        path = REPO / name
        if path.is_file() and path.suffix not in {".png", ".svg", ".gz", ".tar"}:
            out.append(path)
    return out


def test_no_file_cites_a_design_document_the_repository_does_not_have() -> None:
    """Code, tests and docs cite docs/design.md's sections (or a more specific page)."""
    cited = re.compile("DESIGN" + r"(?: §|\.md)")
    offenders = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        offenders += [
            f"{path.relative_to(REPO)}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if cited.search(line)
        ]
    assert offenders == []


ANCHOR = re.compile(r'<a id="([a-z0-9-]+)"></a>')
CITATION = re.compile(r"design\.md#([a-z0-9-]+)")


def test_every_citation_of_the_design_page_names_one_of_its_sections() -> None:
    anchors = set(ANCHOR.findall((REPO / "docs" / "design.md").read_text()))
    assert {"rooms-and-doors", "labelling-contract", "signals", "verdict", "benchmark", "trust"} <= anchors
    cited = {}
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for anchor in CITATION.findall(text):
            cited.setdefault(anchor, path.relative_to(REPO).as_posix())
    assert len(cited) >= 8
    assert {a: p for a, p in cited.items() if a not in anchors} == {}
