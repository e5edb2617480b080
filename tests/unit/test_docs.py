"""The docs say what the code does: every `ghostgpu` command shown in README.md and docs/*.md
parses against the real CLI (a renamed flag or subcommand fails here), the cheap ones run for real,
every other one names the test that runs it, and the architecture picture is current."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ghostgpu.cli import app

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.S)

# Commands run here for real, in a scratch directory that has the example config.
RUN_HERE = {
    ("render",),
    ("bench",),
    ("bench", "detectors"),
    ("calibrate",),
    ("dashboard", "json"),
}
# Commands that need a cluster, a controller process or minutes of machine time, and the tests
# that run them (an e2e test starts the devcluster, runs the controller, restores, benches scale).
RUN_ELSEWHERE = {
    ("controller",): "tests/e2e/test_controller.py (the controller as a subprocess)",
    ("status",): "tests/e2e/test_controller.py::test_pending_job_admitted_once_ghosts_are_gone",
    ("doctor",): "tests/e2e/test_doctor.py (every row ok, then each prerequisite broken in turn)",
    ("report",): "tests/unit/test_controller_report.py, tests/e2e/test_controller.py",
    ("restore",): "tests/e2e/test_controller.py (restore after enforce)",
    ("devcluster", "up"): "tests/e2e/conftest.py (one cluster per session)",
    ("devcluster", "status"): "tests/e2e/test_cluster_lifecycle.py",
    ("devcluster", "down"): "tests/e2e/test_cluster_lifecycle.py",
    ("devcluster", "demo"): "tests/e2e/test_demo.py (to the end, then nothing of it left)",
    ("bench", "scale"): "tests/e2e/test_scale_smoke.py",
    (
        "dashboard",
        "preview",
    ): "tests/e2e/test_dashboard.py; --from-json in tests/unit/test_dashboard_render.py",
}


def shown_commands() -> list[tuple[str, list[str]]]:
    """(page, argv after `ghostgpu`) for every command line in a shell block of the docs."""
    out: list[tuple[str, list[str]]] = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text(encoding="utf-8")):
            for raw in block.splitlines():
                line = raw.split(" #", 1)[0].strip()
                for part in re.split(r"\s*&&\s*", line):
                    words = shlex.split(part) if part else []
                    if words[:1] == ["ghostgpu"]:
                        out.append((page.relative_to(REPO).as_posix(), words[1:]))
    return out


COMMANDS = shown_commands()


def resolve(argv: list[str]) -> tuple[tuple[str, ...], Any]:
    """Parse argv like the CLI would (options, types, subcommands) without running it; returns the
    subcommand path. A file that does not exist on this machine is not a parse error."""
    command: Any = typer.main.get_command(app)
    name, args, path = "ghostgpu", list(argv), []
    while True:
        try:
            ctx = command.make_context(name, args)
        except Exception as exc:  # typer vendors click: match its exceptions by name
            if type(exc).__name__ == "BadParameter" and "does not exist" in str(exc):
                return tuple(path), command
            raise
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not hasattr(command, "resolve_command") or not rest:
            return tuple(path), command
        sub, command, args = command.resolve_command(ctx, rest)
        name = sub
        path.append(sub)


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) >= 20
    assert {p for p, _ in COMMANDS} >= {"README.md", "docs/render.md", "docs/controller.md", "docs/bench.md"}


@pytest.mark.parametrize(("page", "argv"), COMMANDS, ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_every_shown_command_parses_and_is_run_by_a_test(page: str, argv: list[str]) -> None:
    path, _ = resolve(argv)
    assert path in RUN_HERE or path in RUN_ELSEWHERE, f"{page}: `ghostgpu {' '.join(argv)}` is run by no test"


def test_a_stale_flag_would_fail() -> None:
    with pytest.raises(Exception, match="No such option"):
        resolve(["render", "--output-dir", "x"])


@pytest.mark.parametrize(
    "argv",
    sorted({tuple(a) for _, a in COMMANDS if resolve(a)[0] in RUN_HERE}),
    ids=" ".join,
)
def test_cheap_commands_run(argv: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").mkdir()
    example = (REPO / "examples" / "ghostgpu.yaml").read_text()
    for name in ("ghostgpu.yaml", "my-cluster.yaml", "examples/ghostgpu.yaml"):
        (tmp_path / name).write_text(example)
    args = list(argv)
    if "--check" in args:  # a check needs something rendered to compare with
        out = args[args.index("-o") + 1]
        assert CliRunner().invoke(app, ["render", "-c", "my-cluster.yaml", "-o", out]).exit_code == 0
    if args[:1] == ["bench"]:  # the same code path, a smaller fleet
        for flag, small in (("--seeds", "1"), ("--instances", "200")):
            if flag in args:
                args[args.index(flag) + 1] = small
            else:
                args += [flag, small]
    if args[:1] == ["calibrate"] and "--plot" in args:
        args[args.index("--plot") + 1] = str(tmp_path / "calibration.png")
    if "--plot" in args:
        args[args.index("--plot") + 1] = str(tmp_path / "plot.png")
    if "--incidents" in args:
        pytest.skip("needs the reader's incidents file; the built-in set runs in test_calibration")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output


def test_the_architecture_picture_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "draw-architecture"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(page: Path) -> list[Path]:
    """The local files a Markdown page links to (web addresses left out)."""
    targets = LINK.findall(page.read_text(encoding="utf-8"))
    return [(page.parent / t).resolve() for t in targets if "://" not in t and not t.startswith("mailto:")]


def test_every_local_link_resolves() -> None:
    broken = [f"{page.relative_to(REPO)} -> {t}" for page in PAGES for t in _links(page) if not t.exists()]
    assert broken == []


def test_every_docs_file_is_reachable_from_the_readme() -> None:
    """docs/ holds what a reader needs: every page is reached by links from README.md, and every
    other file there (pictures, the data behind them) is named by a reached page."""
    reached, todo = set(), [(REPO / "README.md").resolve()]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        todo += [t for t in _links(page) if t.suffix == ".md" and t.exists()]
    docs = sorted((REPO / "docs").iterdir())
    unreached = [d.name for d in docs if d.suffix == ".md" and d.resolve() not in reached]
    assert unreached == []
    text = "\n".join(p.read_text(encoding="utf-8") for p in reached)
    unnamed = [d.name for d in docs if d.suffix != ".md" and d.name not in text]
    assert unnamed == []
