"""Scripted process tables for kwok pods, so a controller's process probe runs the real exec path
(client -> kube-apiserver -> kwok's kubelet endpoint -> a local command).

Contract (what a test does, what the probe sees):

* kwok runs every exec *locally* with the argv the client sent. The devcluster starts kwok with
  ``<state>/exec-bin`` first on its PATH; that directory holds a ``ps`` shim that ignores its
  arguments and prints the pod's scripted table. So the controller's probe is any argv whose
  argv[0] is ``ps`` (e.g. ``["ps", "-eo", "pid,ppid,stat,etimes,args"]``); the table is printed as is.
* ``ProcessTables.set(namespace, pod, rows)`` writes ``<state>/proctables/<ns>/<pod>.txt`` and a
  kwok ``Exec`` object named after the pod whose local exec carries ``GHOSTGPU_PROC_TABLE=<that
  file>``. Rows print in procps's ``ps -eo pid,ppid,stat,etimes,args`` format under the header
  ``PID PPID STAT ELAPSED COMMAND``; a ``str`` is printed verbatim (e.g. a BusyBox listing).
  ``exit_code`` != 0 makes the probe fail (output still printed to stderr), which a controller
  must treat as a failed signal.
* A pod with no table has no Exec object: kwok answers the exec with an error
  ("no exec found"), i.e. the signal fails. ``ProcessTables.clear`` returns a pod to that state.
* kwok's informer sees a new or changed Exec object a moment later, so ``set`` (wait=True, the
  default) probes through the apiserver until kwok serves exactly the scripted table (or the
  scripted exit code). Rewriting the table of a pod whose Exec is unchanged takes effect at once.
* ``probe(namespace, pod)`` runs the controller's procps argv the same way and returns stdout.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL
from pydantic import BaseModel, Field

from ghostgpu.devcluster.kube import Kube
from ghostgpu.signals.processes import PS_ARGV

PS_SHIM = """#!/bin/sh
# ghostgpu devcluster: `ps` as seen from inside a kwok pod (see ghostgpu/devcluster/kwok_exec.py).
if [ -z "${GHOSTGPU_PROC_TABLE:-}" ]; then
  echo "ps: no process table is scripted for this pod" >&2
  exit 1
fi
if [ "${GHOSTGPU_PROC_EXIT:-0}" != "0" ]; then
  cat "$GHOSTGPU_PROC_TABLE" >&2
  exit "$GHOSTGPU_PROC_EXIT"
fi
exec cat "$GHOSTGPU_PROC_TABLE"
"""


class ProcessRow(BaseModel):
    pid: int = Field(ge=1)
    stat: str = Field(min_length=1, pattern=r"^\S+$")  # e.g. "Ss", "R+", "Z"
    args: str = Field(min_length=1)  # the command line, e.g. "sleep infinity"
    ppid: int | None = Field(None, ge=0)  # None: 0 for pid 1 (the entrypoint), else 1 (its child)
    etimes: int = Field(600, ge=0)


def render_table(rows: Sequence[ProcessRow]) -> str:
    """The text procps's `ps -eo pid,ppid,stat,etimes,args` prints for these rows."""
    lines = [f"{'PID':>7} {'PPID':>7} STAT {'ELAPSED':>7} COMMAND"]
    for r in rows:
        ppid = r.ppid if r.ppid is not None else (0 if r.pid == 1 else 1)
        lines.append(f"{r.pid:>7} {ppid:>7} {r.stat:<4} {r.etimes:>7} {r.args}")
    return "\n".join(lines) + "\n"


def install_shims(exec_bin: Path) -> Path:
    exec_bin.mkdir(parents=True, exist_ok=True)
    ps = exec_bin / "ps"
    ps.write_text(PS_SHIM)
    ps.chmod(0o755)
    return exec_bin


class ProcessTables:
    def __init__(self, kube: Kube, table_dir: Path) -> None:
        self.kube = kube
        self.dir = table_dir

    def path(self, namespace: str, pod: str) -> Path:
        return self.dir / namespace / f"{pod}.txt"

    def set(
        self,
        namespace: str,
        pod: str,
        rows: Sequence[ProcessRow] | str,
        *,
        exit_code: int = 0,
        container: str | None = None,
        wait: bool = True,
        timeout: float = 20.0,
    ) -> None:
        """Script what `ps` prints inside `pod` (all containers unless `container` is given)."""
        text = rows if isinstance(rows, str) else render_table(rows)
        p = self.path(namespace, pod)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(p)  # atomic: a concurrent probe sees the old or the new table, never half
        target: dict[str, object] = {
            "local": {
                "envs": [
                    {"name": "GHOSTGPU_PROC_TABLE", "value": str(p)},
                    {"name": "GHOSTGPU_PROC_EXIT", "value": str(exit_code)},
                ]
            }
        }
        if container:
            target["containers"] = [container]
        self.kube.apply(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "Exec",
                "metadata": {"name": pod, "namespace": namespace},
                "spec": {"execs": [target]},
            }
        )
        if wait:
            self._wait_visible(namespace, pod, container, text, exit_code, timeout)

    def clear(self, namespace: str, pod: str) -> None:
        self.kube.delete("kwok.x-k8s.io/v1alpha1", "Exec", pod, namespace)
        self.path(namespace, pod).unlink(missing_ok=True)

    def probe(self, namespace: str, pod: str, container: str | None = None) -> str:
        """Run the controller's `ps` argv in the pod through the apiserver; stdout (raises on error)."""
        core = client.CoreV1Api(self.kube.api_client)
        kwargs = {"container": container} if container else {}
        resp = stream(
            core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=list(PS_ARGV),
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
            _preload_content=False,
            **kwargs,
        )
        resp.run_forever(timeout=10)
        out, err = resp.read_stdout(), resp.read_stderr()
        status = yaml.safe_load(resp.read_channel(ERROR_CHANNEL) or "{}") or {}
        resp.close()
        if status.get("status") != "Success":
            # NonZeroExitCode carries the code in details.causes; anything else is an exec error.
            causes = (status.get("details") or {}).get("causes") or []
            code = next((c.get("message") for c in causes if c.get("reason") == "ExitCode"), None)
            message = str(status.get("message", "no status from the exec stream"))
            if code is None:  # kwok reports a failed command as an InternalError "... exit status N"
                m = re.search(r"exit status (\d+)", message)
                code = m[1] if m else None
            detail = err.strip() or message
            raise RuntimeError(f"exec in {namespace}/{pod} failed (exit {code}): {detail}")
        return str(out)

    def _wait_visible(
        self, namespace: str, pod: str, container: str | None, text: str, exit_code: int, timeout: float
    ) -> None:
        """Probe until kwok serves exactly what was scripted (its informer lags the Exec object)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                out = self.probe(namespace, pod, container)
                if exit_code == 0 and out == text:
                    return
                last = f"got {out!r}"
            except RuntimeError as e:
                last = str(e)
                if exit_code != 0 and f"(exit {exit_code})" in last:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"kwok did not serve the process table of {namespace}/{pod} in {timeout}s: {last}")
