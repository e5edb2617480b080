"""Start, find and stop the devcluster's processes. Each one runs in its own session (so the CLI
that started it can exit) and is recorded by pid *and* argv[0], so `down` never signals a pid that
the kernel has since handed to an unrelated process."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel


class ProcessRecord(BaseModel):
    name: str
    pid: int
    argv0: str
    log: str


# Ports handed out on this host, under a lock, so devclusters starting at once (one per test
# worker) never pick the same one before its server binds it.
PORT_LEDGER = Path(tempfile.gettempdir()) / "ghostgpu-ports.json"
PORT_HOLD_S = 900.0  # long past any start-up: by then the port is bound, or free again
_PORTS_BELOW = 10_000  # not the well-known and registered ports many services use


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(n: int, *, ledger: Path | None = None, now: float | None = None) -> list[int]:
    """`n` TCP ports on 127.0.0.1 that nothing listens on, chosen below the kernel's ephemeral range
    (an outgoing connection takes its local port from that range, and could take a port picked
    there before the server meant to listen on it starts), none handed out on this host in the
    last PORT_HOLD_S seconds."""
    ledger = ledger or PORT_LEDGER
    now = time.time() if now is None else now
    low_eph, high_eph = _ephemeral_range()
    low, high = (_PORTS_BELOW, low_eph - 1) if low_eph - _PORTS_BELOW > 4 * n else (high_eph + 1, 65535)
    rng = random.SystemRandom()
    with ledger.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            held = {int(k): float(v) for k, v in json.loads(ledger.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            held = {}
        held = {port: t for port, t in held.items() if now - t < PORT_HOLD_S}
        picks: list[int] = []
        for _ in range(100 * n):
            if len(picks) == n:
                break
            port = rng.randint(low, high)
            if port not in held and port not in picks and _bindable(port):
                picks.append(port)
        if len(picks) < n:
            raise RuntimeError(f"no {n} free TCP ports on 127.0.0.1 in {low}-{high}")
        held.update(dict.fromkeys(picks, now))
        tmp = ledger.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(k): v for k, v in sorted(held.items())}))
        os.replace(tmp, ledger)
    return picks


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (see `free_ports`)."""
    return free_ports(1)[0]


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start(
    name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> ProcessRecord:
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,  # own process group: `down` can stop it and its children
        )
    rec = ProcessRecord(name=name, pid=proc.pid, argv0=str(argv[0]), log=str(log))
    # Between fork and exec the child still shows our own cmdline; wait for the exec so that
    # alive() does not mistake a starting process for a dead one.
    deadline = time.monotonic() + 5
    while proc.poll() is None and not alive(rec) and time.monotonic() < deadline:
        time.sleep(0.01)
    return rec


def alive(rec: ProcessRecord) -> bool:
    """True while the recorded pid still runs the recorded program (zombies count as dead)."""
    try:
        cmdline = Path(f"/proc/{rec.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        state = Path(f"/proc/{rec.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return cmdline == rec.argv0 and state != "Z"


def stop(rec: ProcessRecord, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `timeout` seconds."""
    if not alive(rec):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(rec.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(rec.pid)
            if not alive(rec):
                return
            time.sleep(0.1)


def _reap(pid: int) -> None:
    # Our own children become zombies until waited for; other pids raise ChildProcessError.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def wait_for(what: str, check: Callable[[], bool], timeout: float, rec: ProcessRecord | None = None) -> None:
    """Poll `check` until it is true; fail early with the log tail if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # not up yet: connection refused, TLS not ready, 5xx...
            pass
        if rec is not None and not alive(rec):
            raise RuntimeError(f"{rec.name} exited while waiting for {what}; log tail:\n{tail(rec.log)}")
        time.sleep(0.25)
    extra = f"; log tail of {rec.name}:\n{tail(rec.log)}" if rec else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")


def tail(path: str, lines: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
