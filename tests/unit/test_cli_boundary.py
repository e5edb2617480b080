"""Failures at the cluster boundary, as a new user meets them: the real CLI, run as a subprocess
with HOME in a temp dir (no ~/.kube/config) and KUBECONFIG unset, ends in its error and fix lines
and exit 2, never a traceback (ghostgpu/boundary.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from ghostgpu.boundary import diagnose_credentials, explain, name_endpoint, rbac_verb_and_resource

REPO = Path(__file__).resolve().parents[2]


def ghostgpu(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AWS_"))}
    clean.update(HOME=str(home), PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", *args],
        capture_output=True,
        text=True,
        env=clean,
        cwd=home,
        timeout=60,
    )


def assert_named_failure(run: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: "), run.stderr
    for needle in needles:
        assert needle in run.stderr, (needle, run.stderr)


def kubeconfig(path: Path, server: str, *, current: str = "ctx", token: str = "t0ken") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": current,
            }
        )
    )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "args",
    [["status"], ["restore", "deployment/x", "-n", "y"], ["controller", "--max-polls", "1"], ["doctor"]],
    ids=["status", "restore", "controller", "doctor"],
)
def test_no_kubeconfig_names_every_source(tmp_path: Path, args: list[str]) -> None:
    run = ghostgpu(tmp_path, *args)
    assert_named_failure(run, "no Kubernetes credentials", "--kubeconfig", "KUBECONFIG", "~/.kube/config")
    assert "ServiceAccount" in run.stderr


def test_missing_kubeconfig_file(tmp_path: Path) -> None:
    run = ghostgpu(tmp_path, "status", "--kubeconfig", str(tmp_path / "nonexistent"))
    assert_named_failure(run, "no such file")
    assert str(tmp_path / "nonexistent") in run.stderr


def test_missing_file_named_by_the_environment(tmp_path: Path) -> None:
    run = ghostgpu(tmp_path, "status", env={"KUBECONFIG": str(tmp_path / "gone.yaml")})
    assert_named_failure(run, "KUBECONFIG=", "no such file", str(tmp_path / "gone.yaml"))


def test_current_context_not_in_the_file(tmp_path: Path) -> None:
    cfg = kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", current="prod")
    run = ghostgpu(tmp_path, "status", "--kubeconfig", str(cfg))
    assert_named_failure(run, "current-context 'prod' is not one of its contexts (ctx)", "use-context")


def test_refused_apiserver_port_names_the_address(tmp_path: Path) -> None:
    port = free_port()
    cfg = kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")
    run = ghostgpu(tmp_path, "status", "--kubeconfig", str(cfg))
    assert_named_failure(run, "cannot reach the Kubernetes apiserver", f"127.0.0.1:{port}")


class _Forbidding(BaseHTTPRequestHandler):
    """An apiserver that refuses everything, with the Status body a real one sends."""

    def do_GET(self) -> None:
        body = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Forbidden",
                "code": 403,
                "message": 'nodes is forbidden: User "viewer" cannot list resource "nodes" in API group ""',
            }
        ).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def forbidding_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forbidding)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_forbidden_names_verb_and_resource(tmp_path: Path, forbidding_server: str) -> None:
    cfg = kubeconfig(tmp_path / "kc", forbidding_server)
    run = ghostgpu(tmp_path, "status", "--kubeconfig", str(cfg))
    assert_named_failure(run, "403 Forbidden to list", 'cannot list resource "nodes"', "fix: grant")


def test_debug_keeps_the_traceback(tmp_path: Path) -> None:
    run = ghostgpu(tmp_path, "--debug", "status")
    assert run.returncode not in (0, 2)
    assert "Traceback" in run.stderr and "BoundaryError" in run.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    run = ghostgpu(tmp_path, "status", "-c", str(tmp_path / "ghostgpu.yaml"))
    assert_named_failure(run, str(tmp_path / "ghostgpu.yaml"))


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", "https://h/api/v1/nodes", ("list", "nodes")),
        ("GET", "https://h/api/v1/namespaces/a/pods?watch=true", ("watch", "pods in namespace a")),
        ("GET", "https://h/api/v1/namespaces/a/pods/p", ("get", "pods in namespace a")),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/a/deployments/d/scale",
            ("patch", "deployments/scale.apps in namespace a"),
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/g/leases/l",
            ("update", "leases.coordination.k8s.io in namespace g"),
        ),
        (
            "GET",
            "https://h/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
            ("list", "clusterqueues.kueue.x-k8s.io"),
        ),
        ("POST", "https://h/api/v1/namespaces", ("create", "namespaces")),
    ],
)
def test_rbac_verb_and_resource(method: str, url: str, expected: tuple[str, str]) -> None:
    assert rbac_verb_and_resource(method, url) == expected


def test_diagnose_in_cluster_serviceaccount_is_usable(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("x")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert diagnose_credentials(None, environ=env, home=tmp_path, serviceaccount=sa) is None
    assert diagnose_credentials(None, environ={}, home=tmp_path, serviceaccount=sa) is not None


def test_diagnose_context_naming_an_undefined_cluster(tmp_path: Path) -> None:
    cfg = kubeconfig(tmp_path / "kc", "https://x")
    doc = yaml.safe_load(cfg.read_text())
    doc["contexts"][0]["context"]["cluster"] = "elsewhere"
    cfg.write_text(yaml.safe_dump(doc))
    err = diagnose_credentials(str(cfg), environ={}, home=tmp_path)
    assert err is not None and "names cluster 'elsewhere'" in err.lines[0]


def _status_error(url: str, code: int, body: dict[str, str]) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", url)
    response = httpx.Response(code, json=body, request=request)
    return httpx.HTTPStatusError("error", request=request, response=response)


def test_prometheus_rejecting_a_query_is_named() -> None:
    name_endpoint("http://127.0.0.1:9999", "Prometheus (controller.prometheus.url)")
    exc = _status_error("http://127.0.0.1:9999/api/v1/query", 400, {"error": 'parse error: unexpected "}"'})
    lines = explain(exc)
    assert lines is not None and "Prometheus (controller.prometheus.url) at http://127.0.0.1:9999" in lines[0]
    assert "rejected the query: parse error" in lines[0]


def test_unauthorized_says_to_refresh_the_credentials() -> None:
    name_endpoint("https://127.0.0.1:6443", "the Kubernetes apiserver")
    lines = explain(_status_error("https://127.0.0.1:6443/api/v1/pods", 401, {"message": "Unauthorized"}))
    assert lines is not None and "401 Unauthorized" in lines[0] and "refresh" in lines[1]


def test_an_unnamed_failure_keeps_its_traceback() -> None:
    assert explain(RuntimeError("a bug")) is None
    assert explain(KeyError("x")) is None
