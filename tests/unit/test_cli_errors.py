"""Every `ghostgpu` command, given a bad file, a bad flag or a bad environment variable, ends in
`error:` lines and one `fix:` line on stderr and exit 2, never a traceback; `--debug` keeps the
traceback. Each case runs the real CLI as a new user would: a subprocess with HOME in a temp dir
(no ~/.kube/config), no KUBE*/AWS_* variables, and nothing that needs a cluster (ghostgpu/boundary.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ghostgpu.cli import app

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "ghostgpu.yaml").read_text())


def ghostgpu(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess: what a user runs, down to the interpreter's own traceback."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AWS_", "GHOSTGPU_", "POD_"))}
    for name in ("NODE_NAME", *PROXIES):
        clean.pop(name, None)
    clean.update(HOME=str(home), PYTHONPATH=str(REPO), COLUMNS="200", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", *args],
        capture_output=True,
        text=True,
        env=clean,
        cwd=home,
        timeout=120,
    )


def in_process(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The same through typer's runner in this process (the same root command and boundary), for
    the many cases where a subprocess per case would only add interpreter start-ups."""
    unset: dict[str, str | None] = {
        k: None
        for k in os.environ
        if k.startswith(("KUBE", "AWS_", "GHOSTGPU_", "POD_")) or k in ("NODE_NAME", *PROXIES)
    }
    result = CliRunner().invoke(app, list(args), env={**unset, "HOME": str(home), **(env or {})})
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(
            traceback.format_exception(result.exception)
        )
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, stderr)


def assert_error_and_fix(run: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2; stderr is `error:` lines ended by one `fix:` line; each needle is in it."""
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) >= 2, run.stderr
    assert all(line.startswith("error: ") for line in lines[:-1]), run.stderr
    assert lines[-1].startswith("fix: ") and len(lines[-1]) > len("fix: ") + 10, run.stderr
    for needle in needles:
        assert needle in run.stderr, (needle, run.stderr)


def write(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def yaml_syntax_error(tmp: Path) -> str:
    return write(tmp, "ghostgpu.yaml", "controller:\n  mode: [shadow\n")


def whole_file_without_kind(tmp: Path) -> str:
    data = {k: v for k, v in EXAMPLE.items() if k not in ("apiVersion", "kind")}
    return write(tmp, "ghostgpu.yaml", yaml.safe_dump(data))


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
PROXIES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")

# (id, args with {tmp} / {yaml_error} placeholders, environment, needles)
Case = tuple[str, list[str], dict[str, str], list[str]]

# The exact commands of the report this test answers: a YAML syntax error, bad overrides.
REPORTED: list[Case] = [
    ("status -c syntax", ["status", "-c", "{yaml_error}"], {}, ["invalid YAML", "(line 3)"]),
    ("controller -c syntax", ["controller", "-c", "{yaml_error}"], {}, ["invalid YAML"]),
    ("restore -c syntax", ["restore", "deployment/x", "-n", "y", "-c", "{yaml_error}"], {}, ["invalid YAML"]),
    ("agent -c syntax", ["agent", "--node-name", "n", "-c", "{yaml_error}"], {}, ["invalid YAML"]),
    (
        "controller --mode enforced",
        ["controller", "--mode", "enforced"],
        {},
        ["error: --mode 'enforced': expected 'shadow' or 'enforce'", "fix: give --mode"],
    ),
    (
        "controller --poll-interval 5x",
        ["controller", "--poll-interval", "5x"],
        {},
        ["error: --poll-interval '5x': expected a duration such as 30s"],
    ),
]

# For each command: a bad file, a bad flag and, where the command reads one, a bad environment variable.
EVERY_COMMAND: list[Case] = [
    ("render file", ["render", "-c", "{bad_types}", "-o", "{tmp}/out"], {}, ["controller.replicas", "line"]),
    ("render flag", ["render", "-o", "{a_file}"], {}, ["cannot write the bundles", "fix: give -o"]),
    ("render flag unknown", ["render", "-o", "{tmp}/o", "--chek"], {}, ["No such option", "--help"]),
    ("doctor file", ["doctor", "-c", "{unknown_key}"], {}, ["controller.pollIntervl: unknown key"]),
    ("doctor flag", ["doctor", "--prometheus-url", "ftp://x"], {}, ["--prometheus-url 'ftp://x'"]),
    ("doctor env", ["doctor"], {"KUBECONFIG": "{tmp}/gone"}, ["KUBECONFIG=", "no such file"]),
    ("status file", ["status", "-c", "{tmp}/absent.yaml"], {}, ["cannot read file"]),
    ("status flag", ["status", "--by", "team"], {}, ["--by 'team'", "fix: give --by flavor"]),
    ("status env", ["status"], {"KUBECONFIG": "{tmp}/gone"}, ["KUBECONFIG=", "no such file"]),
    (
        "status env proxy",
        ["status", "--kubeconfig", "{kubeconfig}"],
        {"HTTPS_PROXY": "::bad"},
        ["the proxy variables set: HTTPS_PROXY='::bad'", "fix: give each proxy variable a URL"],
    ),
    ("report file", ["report", "{a_file}"], {}, ["line 1: not a decision record"]),
    ("report flag", ["report", "http://127.0.0.1:1/decisions"], {}, ["cannot reach the controller"]),
    ("restore file", ["restore", "deployment/x", "-n", "y", "-c", "{unknown_key}"], {}, ["unknown key"]),
    ("restore flag", ["restore", "deploy", "-n", "y"], {}, ["expected KIND/NAME", "fix: give KIND/NAME"]),
    ("restore env", ["restore", "deployment/x", "-n", "y"], {"KUBECONFIG": "{tmp}/gone"}, ["no such file"]),
    ("controller file", ["controller", "-c", "{bad_types}"], {}, ["controller.replicas"]),
    ("controller flag", ["controller", "--retry-period", "20"], {}, ["--retry-period 20"]),
    (
        "controller flag url",
        ["controller", "--prometheus-url", "prom:9090"],
        {},
        ["--prometheus-url 'prom:9090'"],
    ),
    ("controller env", ["controller"], {"POD_NAMESPACE": "Team_A"}, ["POD_NAMESPACE='Team_A'"]),
    ("agent file", ["agent", "--node-name", "n", "-c", "{unknown_key}"], {}, ["unknown key"]),
    ("agent flag", ["agent", "--node-name", "n", "--listen", "9402"], {}, ["--listen '9402'"]),
    ("agent env", ["agent"], {"NODE_NAME": ""}, ["NODE_NAME"]),
    ("bench flag", ["bench", "--json", "--markdown"], {}, ["choose one of --json and --markdown"]),
    ("bench scale file", ["bench", "scale", "--from-json", "{a_file}"], {}, ["--from-json"]),
    ("bench scale flag", ["bench", "scale", "--sizes", "a,b"], {}, ["--sizes 'a,b'"]),
    ("calibrate file", ["calibrate", "--incidents", "{a_file}"], {}, ["fix: give --incidents"]),
    ("calibrate config", ["calibrate", "-c", "{yaml_error}"], {}, ["invalid YAML"]),
    ("calibrate flag", ["calibrate", "--per-type-ceiling", "all"], {}, ["--per-type-ceiling 'all'"]),
    (
        "dashboard file",
        ["dashboard", "preview", "-o", "{tmp}/p.png", "--from-json", "{a_file}"],
        {},
        ["--from-json"],
    ),
    (
        "dashboard flag",
        ["dashboard", "preview", "-o", "{tmp}/p.png", "--prometheus", "prom"],
        {},
        ["--prometheus"],
    ),
    (
        "devcluster file",
        ["devcluster", "status", "--state-dir", "{state_dir}"],
        {},
        ["not a devcluster state file"],
    ),
    ("devcluster flag", ["devcluster", "up", "--provider", "k3d"], {}, ["--provider 'k3d'"]),
    (
        "devcluster env version",
        ["devcluster", "up", "--state-dir", "{tmp}/cluster"],
        {"GHOSTGPU_KUEUE_VERSION": "latest"},
        ["GHOSTGPU_KUEUE_VERSION='latest'", "fix: unset GHOSTGPU_KUEUE_VERSION"],
    ),
    (
        "devcluster env cache",
        ["devcluster", "up", "--state-dir", "{tmp}/cluster"],
        {"GHOSTGPU_CACHE": "{tmp}/empty-cache"},
        ["binaries missing", "GHOSTGPU_CACHE"],
    ),
]


def _fill(text: str, tmp: Path) -> str:
    files = {
        "{yaml_error}": lambda: yaml_syntax_error(tmp),
        "{bad_types}": lambda: write(
            tmp, "types.yaml", yaml.safe_dump({**EXAMPLE, "controller": {"replicas": "two"}})
        ),
        "{unknown_key}": lambda: write(
            tmp, "keys.yaml", yaml.safe_dump({**EXAMPLE, "controller": {"pollIntervl": "30s"}})
        ),
        "{a_file}": lambda: write(tmp, "garbage.json", "{not json\n"),
        "{kubeconfig}": lambda: write(tmp, "kubeconfig", KUBECONFIG),
        "{state_dir}": lambda: str(Path(write(tmp, "state.json", "{not json\n")).parent),
    }
    for key, make in files.items():
        if key in text:
            text = text.replace(key, make())
    return text.replace("{tmp}", str(tmp))


@pytest.mark.parametrize(("args", "env", "needles"), [c[1:] for c in REPORTED], ids=[c[0] for c in REPORTED])
def test_reported_commands_end_in_error_and_fix(
    tmp_path: Path, args: list[str], env: dict[str, str], needles: list[str]
) -> None:
    run = ghostgpu(tmp_path, *[_fill(a, tmp_path) for a in args], env=env)
    assert_error_and_fix(run, *needles)


@pytest.mark.parametrize(
    ("args", "env", "needles"), [c[1:] for c in EVERY_COMMAND], ids=[c[0] for c in EVERY_COMMAND]
)
def test_every_command_ends_in_error_and_fix(
    tmp_path: Path, args: list[str], env: dict[str, str], needles: list[str]
) -> None:
    filled_env = {k: _fill(v, tmp_path) for k, v in env.items()}
    run = in_process(tmp_path, *[_fill(a, tmp_path) for a in args], env=filled_env)
    assert_error_and_fix(run, *needles)


def test_every_command_is_covered() -> None:
    """A new command joins EVERY_COMMAND (a bad file, flag, environment variable where it reads one)."""
    from typer.main import get_command

    root = get_command(app)
    commands = set(root.commands)  # type: ignore[attr-defined]
    covered = {c[1][0] for c in EVERY_COMMAND}
    assert commands == covered


@pytest.mark.parametrize(
    "args",
    [["controller", "--mode", "enforced"], ["status", "-c", "{yaml_error}"]],
    ids=["flag", "file"],
)
def test_debug_alone_shows_the_traceback(tmp_path: Path, args: list[str]) -> None:
    run = ghostgpu(tmp_path, "--debug", *[_fill(a, tmp_path) for a in args])
    assert run.returncode not in (0, 2) and "Traceback" in run.stderr, run.stderr


def test_a_whole_file_without_kind_is_read_as_the_whole_file_everywhere(tmp_path: Path) -> None:
    """Same rule for every command: render renders it, and the commands that read the controller
    section find it under `controller:` instead of calling the file's own keys unknown."""
    config = whole_file_without_kind(tmp_path)
    rendered = ghostgpu(tmp_path, "render", "-c", config, "-o", str(tmp_path / "out"))
    assert rendered.returncode == 0, rendered.stderr
    for args in (
        ["status"],
        ["controller"],
        ["restore", "deployment/x", "-n", "y"],
        ["agent", "--node-name", "n"],
    ):
        run = ghostgpu(tmp_path, *args, "-c", config)
        assert_error_and_fix(run, "no Kubernetes credentials")  # read fine; stopped at the cluster
        assert "unknown key" not in run.stderr


def test_a_controller_section_is_no_whole_file(tmp_path: Path) -> None:
    section = write(tmp_path, "ghostgpu-controller.yaml", "mode: enforce\npollInterval: 30s\n")
    run = ghostgpu(tmp_path, "render", "-c", section, "-o", str(tmp_path / "out"))
    assert_error_and_fix(run, "this is a controller section", "fix: give the whole ghostgpu.yaml")
    controller = ghostgpu(tmp_path, "controller", "-c", section)
    assert_error_and_fix(controller, "no Kubernetes credentials")


def test_a_controller_key_at_the_top_of_a_whole_file_says_where_it_goes(tmp_path: Path) -> None:
    config = write(tmp_path, "ghostgpu.yaml", yaml.safe_dump({**EXAMPLE, "mode": "enforce"}))
    run = ghostgpu(tmp_path, "status", "-c", config)
    assert_error_and_fix(
        run, "mode: unknown key at the top level of the whole file: a controller key goes under"
    )


async def test_an_address_in_use_is_named() -> None:
    """`--port`/`--listen` on a taken port: the listener's own OSError, as the boundary words it."""
    import asyncio
    import socket

    from ghostgpu.boundary import explain

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            await asyncio.start_server(lambda r, w: None, "127.0.0.1", port)
        except OSError as exc:
            lines = explain(exc)
        else:
            pytest.fail("bound a taken port")
    assert lines is not None and lines[0].startswith("error: cannot listen:") and str(port) in lines[0]
    assert lines[1].startswith("fix: choose another address or port")


@pytest.mark.parametrize(
    ("data", "whole"),
    [
        ({"flavors": [], "teams": []}, True),  # no kind: still the whole file
        ({"kind": "GhostgpuConfig"}, True),
        ({"controller": {"mode": "enforce"}}, True),
        ({"mode": "enforce", "pollInterval": "30s"}, False),
        ({}, False),  # empty: the controller section's defaults
        ({"flavors": [], "mode": "enforce"}, True),  # mixed: whole, and `mode` is flagged
        ({"pollIntervl": "30s"}, False),  # a misspelt controller key
        ({"flavours": []}, True),  # a misspelt whole-file key
    ],
)
def test_one_rule_tells_the_whole_file_from_the_controller_section(
    data: dict[str, object], whole: bool
) -> None:
    from ghostgpu.config import is_whole_file

    assert is_whole_file(data) is whole
