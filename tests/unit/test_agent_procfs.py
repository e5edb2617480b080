"""A container's processes read from a proc root, as its own `ps -eo pid,ppid,stat,etimes,args`
lists them: on a fake proc tree (every column's rule), and on this machine's real /proc against
the real `ps` run inside a real pid namespace whose processes sit in a kubepods-like cgroup."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ghostgpu.agent import procfs
from ghostgpu.agent.cgroups import ContainerRef
from ghostgpu.signals.processes import MAX_ARGS, parse_ps

UID = "5f0c6a1e-8f3b-4b7e-9d2a-0c1e2f3a4b5c"
CID = "c" * 64
OTHER = "d" * 64
HZ = os.sysconf("SC_CLK_TCK")


class FakeProc:
    """A proc root of files as the kernel writes them."""

    def __init__(self, root: Path, uptime: float = 1000.0) -> None:
        self.root = root
        root.mkdir(exist_ok=True)
        (root / "uptime").write_text(f"{uptime:.2f} 1234.00\n")
        (root / "self").mkdir(exist_ok=True)  # not a pid: ignored

    def add(
        self,
        pid: int,
        *,
        ppid: int,
        nspid: tuple[int, ...],
        cgroup: str = f"0::/kubepods/besteffort/pod{UID}/{CID}",
        argv: list[str] | None = None,
        comm: str = "sleep",
        state: str = "S",
        pgrp: int | None = None,
        session: int = 0,
        tpgid: int = -1,
        nice: int = 0,
        threads: int = 1,
        start_s: float = 900.0,
        locked_kb: int | None = 0,
    ) -> None:
        d = self.root / str(pid)
        d.mkdir()
        fields = [
            state, ppid, pgrp if pgrp is not None else pid, session, 0, tpgid, 4194560,
            0, 0, 0, 0, 0, 0, 0, 0, 20, nice, threads, 0, int(start_s * HZ), 0,
        ]  # fmt: skip
        (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n")
        status = f"Name:\t{comm}\nState:\t{state}\nNSpid:\t" + "\t".join(map(str, nspid)) + "\n"
        if locked_kb is not None:
            status += f"VmLck:\t{locked_kb:8d} kB\n"
        (d / "status").write_text(status)
        (d / "cgroup").write_text(cgroup + "\n")
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in (argv or [])))


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def listing(fake: FakeProc, container: str = CID) -> list[tuple[int, int, str, int | None, str]]:
    got = procfs.scan(fake.root)
    group = [p for p in got.processes.values() if p.container.container_id == container]
    return [(r.pid, r.ppid, r.state, r.elapsed_s, r.command) for r in procfs.rows(group, "pod/c")]


def test_pids_and_parents_are_the_containers_own(fake: FakeProc) -> None:
    # The shim (outside the container) starts pid 1; an exec'd process's parent is outside too.
    fake.add(500, ppid=1, nspid=(500,), cgroup="0::/system.slice/containerd.service", comm="shim")
    fake.add(501, ppid=500, nspid=(501, 1), argv=["/bin/sh", "-c", "train; sleep infinity"], comm="sh")
    fake.add(502, ppid=501, nspid=(502, 7), argv=["sleep", "infinity"], start_s=950.5)
    fake.add(600, ppid=500, nspid=(600, 12), argv=["bash"], comm="bash")  # kubectl exec
    fake.add(601, ppid=600, nspid=(601, 13), argv=["top"], comm="top", state="R")
    assert listing(fake) == [
        (1, 0, "S", 100, "/bin/sh -c train; sleep infinity"),
        (7, 1, "S", 49, "sleep infinity"),  # int(1000 - 950.5)
        (12, 0, "S", 100, "bash"),
        (13, 12, "R", 100, "top"),
    ]


def test_stat_is_built_in_procps_order(fake: FakeProc) -> None:
    fake.add(501, ppid=9, nspid=(501, 1), argv=["init"], session=501, threads=4, nice=-5, locked_kb=8)
    fake.add(502, ppid=501, nspid=(502, 2), argv=["nice"], nice=10)
    fake.add(503, ppid=501, nspid=(503, 3), argv=["vim"], pgrp=503, tpgid=503, session=501, state="T")
    fake.add(504, ppid=501, nspid=(504, 4), argv=["bash"], session=504, pgrp=504, tpgid=503)
    fake.add(505, ppid=501, nspid=(505, 5), argv=["w"], state="D", locked_kb=None)  # no VmLck line
    assert [(pid, stat) for pid, _, stat, _, _ in listing(fake)] == [
        (1, "S<Lsl"),
        (2, "SN"),
        (3, "T+"),
        (4, "Ss"),
        (5, "D"),
    ]


def test_args_as_ps_prints_them(fake: FakeProc) -> None:
    fake.add(501, ppid=9, nspid=(501, 1), argv=[], comm="kworker")  # empty cmdline: [comm]
    fake.add(502, ppid=501, nspid=(502, 2), argv=[], comm="python3", state="Z")
    fake.add(503, ppid=501, nspid=(503, 3), argv=["x" * 600])
    fake.add(504, ppid=501, nspid=(504, 4), argv=["sh", "-c", "a\nb\tc\x7fd\x85e\u00e9"])
    # A program that rewrote its argv in place: one string, spaces in it, trailing NULs.
    fake.add(505, ppid=501, nspid=(505, 5), comm="nginx")
    (fake.root / "505" / "cmdline").write_bytes(b"nginx: master process\0\0\0")
    fake.add(506, ppid=501, nspid=(506, 6), argv=["My (odd) prog"], comm="a) b (c")
    got = {pid: args for pid, _, _, _, args in listing(fake)}
    assert got[1] == "[kworker]"
    assert got[2] == "[python3] <defunct>"
    assert got[3] == "x" * MAX_ARGS
    assert got[4] == "sh -c a b?c?d?e\u00e9"  # as procps 4 prints them in a UTF-8 locale
    assert got[5] == "nginx: master process"
    assert got[6] == "My (odd) prog"


def test_a_shared_pid_namespace_lists_the_sandbox_and_every_container(fake: FakeProc) -> None:
    sandbox = "e" * 64
    pod = f"0::/kubepods/pod{UID}"
    fake.add(700, ppid=1, nspid=(700,), cgroup="0::/system.slice/containerd.service", comm="shim")
    fake.add(701, ppid=700, nspid=(701, 1), cgroup=f"{pod}/{sandbox}", argv=["/pause"], comm="pause")
    fake.add(702, ppid=700, nspid=(702, 7), cgroup=f"{pod}/{CID}", argv=["sleep", "infinity"])
    fake.add(703, ppid=700, nspid=(703, 9), cgroup=f"{pod}/{OTHER}", argv=["sh"], comm="sh")
    fake.add(704, ppid=703, nspid=(704, 10), cgroup=f"{pod}/{OTHER}", argv=["sleep", "5"])
    got = procfs.scan(fake.root)
    group = [p for p in got.processes.values() if p.container.pod_uid == UID]
    assert [(r.pid, r.ppid, r.command) for r in procfs.rows(group, "p/c")] == [
        (1, 0, "/pause"),
        (7, 0, "sleep infinity"),
        (9, 0, "sh"),
        (10, 9, "sleep 5"),
    ]


def test_a_pid_namespace_nested_in_the_container_is_listed_at_the_containers_depth(
    fake: FakeProc,
) -> None:
    fake.add(501, ppid=9, nspid=(501, 1), argv=["sh"], comm="sh")
    fake.add(502, ppid=501, nspid=(502, 2), argv=["unshare", "-p", "-f", "sleep", "9"])
    fake.add(503, ppid=502, nspid=(503, 3, 1), argv=["sleep", "9"])
    assert [(p, pp) for p, pp, *_ in listing(fake)] == [(1, 0), (2, 1), (3, 2)]


def test_only_the_containers_asked_for_are_read(fake: FakeProc) -> None:
    fake.add(501, ppid=9, nspid=(501, 1), argv=["a"])
    fake.add(502, ppid=9, nspid=(502, 1), argv=["b"], cgroup=f"0::/kubepods/pod{UID}/{OTHER}")
    fake.add(503, ppid=9, nspid=(503,), argv=["c"], cgroup="0::/user.slice")
    got = procfs.scan(fake.root, lambda ref: ref.container_id == OTHER)
    assert sorted(got.processes) == [502]
    assert got.processes[502].container == ContainerRef(UID, OTHER)
    assert (got.scanned, got.unplaced, got.failed) == (3, 0, {})


def test_a_process_that_vanishes_mid_read_is_skipped(fake: FakeProc) -> None:
    fake.add(501, ppid=9, nspid=(501, 1), argv=["a"])
    fake.add(502, ppid=501, nspid=(502, 2), argv=["b"])
    fake.add(503, ppid=501, nspid=(503, 3), argv=["c"])
    (fake.root / "502" / "cmdline").unlink()  # exited between its cgroup and its cmdline
    for f in (fake.root / "503").iterdir():  # exited before its cgroup was read
        f.unlink()
    got = procfs.scan(fake.root)
    assert sorted(got.processes) == [501]
    assert (got.unplaced, got.failed) == (0, {})


def test_a_file_that_is_there_but_unreadable_is_counted(fake: FakeProc) -> None:
    fake.add(501, ppid=9, nspid=(501, 1), argv=["a"])
    fake.add(502, ppid=9, nspid=(502, 1), argv=["a"], cgroup=f"0::/kubepods/pod{UID}/{OTHER}")
    (fake.root / "502" / "stat").write_text("garbage")
    (fake.root / "503").mkdir()
    (fake.root / "503" / "cgroup").mkdir()  # reading it fails (EISDIR), not because it is gone
    got = procfs.scan(fake.root)
    assert sorted(got.processes) == [501]
    assert got.unplaced == 1  # 503: no cgroup read, it may be any container's
    assert got.failed == {ContainerRef(UID, OTHER): procfs.Incomplete.PROC_UNREADABLE}  # 502's own


def test_a_longer_file_than_the_kernel_writes_fails_its_container(fake: FakeProc) -> None:
    fake.add(501, ppid=9, nspid=(501, 1), argv=["a"])
    with (fake.root / "501" / "status").open("a") as f:
        f.write("Groups:\t" + " ".join(map(str, range(65536))) + "\n")
    got = procfs.scan(fake.root)
    assert got.failed == {ContainerRef(UID, CID): procfs.Incomplete.PROC_UNREADABLE}


def test_an_unlistable_proc_root_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(procfs.ProcUnreadable, match="cannot list"):
        procfs.scan(tmp_path / "absent")


# --- the real /proc ------------------------------------------------------------------------------


def _own_cgroup_dir() -> Path | None:
    """A cgroup directory this process may create children in: the v1 memory hierarchy's (a hybrid
    host like this one) or the unified one's, below its own cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        base = Path("/sys/fs/cgroup") / ("memory" if controllers == "memory" else "")
        if controllers in ("memory", "") and (base / path.lstrip("/") / "cgroup.procs").exists():
            if controllers == "" and not (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
                continue  # hybrid: the unified mount is elsewhere and holds no controllers here
            return base / path.lstrip("/")
    return None


@pytest.fixture
def container_cgroup() -> Iterator[tuple[Path, ContainerRef]]:
    base = _own_cgroup_dir()
    if os.geteuid() != 0 or base is None or shutil.which("unshare") is None:
        pytest.skip("needs root, unshare and a writable cgroup hierarchy")
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex * 2
    top = base / f"kubepods-test-{uid[:8]}"
    leaf = top / "kubepods" / "burstable" / f"pod{uid}" / cid
    leaf.mkdir(parents=True)
    try:
        yield leaf, ContainerRef(uid, cid)
    finally:
        for pid in (leaf / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (leaf / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            d.rmdir()
        top.rmdir()


SCRIPT = """
echo 0 > {procs}
sleep 1000 &
nice -n 5 sleep 1001 &
nice -n -5 sleep 1002 &
setsid sleep 1003 &
(sh -c 'exit 0' & exec sleep 1004) &
python3 -c 'import ctypes, threading, time
ctypes.CDLL(None).mlockall(1)
threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
time.sleep(1000)' &
python3 -c 'import os; os.execvp("sleep", ["sleep\\tx", "1005"])' &
wait
"""


def test_rows_equal_what_ps_prints_in_a_real_pid_namespace(
    container_cgroup: tuple[Path, ContainerRef],
) -> None:
    leaf, ref = container_cgroup
    ns = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", SCRIPT.format(procs=leaf / "cgroup.procs")]
    )
    try:
        init = _wait_for_rows(leaf, 8)  # the zombie has left cgroup.procs, not /proc
        time.sleep(1.2)  # etimes > 0, so whole-second rounding is exercised
        # -ww: without a terminal ps cuts its last column at 80 characters; the rows keep MAX_ARGS.
        ps = subprocess.run(
            ["nsenter", "-t", str(init), "-p", "-m", "ps", "-ww", "-eo", "pid,ppid,stat,etimes,args"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        got = procfs.scan(Path("/proc"), lambda r: r == ref)
        ours = procfs.rows(got.processes.values(), "pod/c")
        theirs = parse_ps(ps, scope="pod/c")  # the probe (ps, ppid 0) dropped as the exec source does
        print(ps)
        assert [(r.pid, r.ppid, r.state, r.command) for r in ours] == [
            (r.pid, r.ppid, r.state, r.command) for r in theirs
        ]
        for a, b in zip(ours, theirs, strict=True):
            assert a.elapsed_s is not None and b.elapsed_s is not None
            assert abs(a.elapsed_s - b.elapsed_s) <= 1, (a, b)
        stats = {r.command: r.state for r in ours}
        # Each flag really came up on this machine (the comparison above is not vacuous).
        assert stats["sleep 1001"] == "SN" and stats["sleep 1002"] == "S<"
        assert stats["sleep 1003"] == "Ss" and "[sh] <defunct>" in stats
        assert any(s.startswith("S") and "L" in s and "l" in s for s in stats.values())
        assert "sleep?x 1005" in stats
        assert ours[0].pid == 1 and ours[0].ppid == 0
    finally:
        ns.kill()
        ns.wait()


def _nspid(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # exited since cgroup.procs was read
        return [0]
    line = next(ln for ln in text.splitlines() if ln.startswith("NSpid:"))
    return [int(x) for x in line.split()[1:]]


def _wait_for_rows(leaf: Path, n: int) -> int:
    """The namespace's pid 1 (host pid) once n processes (threads apart) are in the cgroup."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
        if len(pids) >= n:
            time.sleep(0.3)  # the exec'd ones have exec'd
            return next(p for p in pids if _nspid(p)[-1] == 1)
        time.sleep(0.05)
    raise AssertionError(f"only {(leaf / 'cgroup.procs').read_text().split()} in {leaf}")


def test_a_zombie_whose_cgroup_v1_reads_root_is_placed_with_its_parent(fake: FakeProc) -> None:
    root_v1 = "4:memory:/\n1:name=systemd:/\n0::/"
    fake.add(501, ppid=9, nspid=(501, 1), argv=["sh"], comm="sh", cgroup=f"4:memory:/kubepods/pod{UID}/{CID}")
    fake.add(502, ppid=501, nspid=(502, 2), argv=[], comm="python3", state="Z", cgroup=root_v1)
    fake.add(503, ppid=9, nspid=(503,), argv=[], comm="stray", state="Z", cgroup=root_v1)  # not ours
    fake.add(504, ppid=501, nspid=(504,), argv=["init"], comm="init", cgroup=root_v1)  # live: no
    assert [(p, pp, st, a) for p, pp, st, _, a in listing(fake)] == [
        (1, 0, "S", "sh"),
        (2, 1, "Z", "[python3] <defunct>"),
    ]


# --- what a tenant's process can do to the scan ------------------------------------------------


def test_a_process_named_like_a_status_line_is_read_as_any_other(fake: FakeProc) -> None:
    # prctl(PR_SET_NAME, "\x1cVmLck:"): the kernel prints the name in `status` unescaped; a split
    # on every Unicode line boundary (str.splitlines) would read it as a `VmLck:` line of no value.
    fake.add(501, ppid=9, nspid=(501, 1), argv=["sleep", "1"])
    fake.add(502, ppid=9, nspid=(502, 1), argv=[], comm="\x1cVmLck:", cgroup=f"0::/kubepods/pod{UID}/{OTHER}")
    got = procfs.scan(fake.root)
    assert got.failed == {} and got.unplaced == 0
    assert sorted(got.processes) == [501, 502]
    assert got.processes[502].args == "[\x1cVmLck:]" and got.processes[502].stat == "S"


def test_a_huge_cmdline_is_read_only_as_far_as_it_is_kept(fake: FakeProc) -> None:
    import tracemalloc

    fake.add(501, ppid=9, nspid=(501, 1), argv=["python3", "-c", "x" * (6 << 20)])
    tracemalloc.start()
    try:
        got = procfs.scan(fake.root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.processes[501].args == ("python3 -c " + "x" * MAX_ARGS)[:MAX_ARGS]
    assert peak < 256 << 10, f"{peak / 2**20:.1f} MiB to read a 6 MiB command line"


def test_a_container_over_the_process_cap_is_incomplete_and_others_are_not(fake: FakeProc) -> None:
    for pid in range(501, 506):
        fake.add(pid, ppid=501, nspid=(pid, pid - 500), argv=["sleep", "1"])
    fake.add(601, ppid=9, nspid=(601, 1), argv=["train"], cgroup=f"0::/kubepods/pod{UID}/{OTHER}")
    got = procfs.scan(fake.root, max_per_container=4)
    assert got.failed == {ContainerRef(UID, CID): procfs.Incomplete.TOO_MANY_PROCESSES}
    assert [p for p in got.processes.values() if p.container.container_id == OTHER] == [got.processes[601]]
    assert len([p for p in got.processes.values() if p.container.container_id == CID]) <= 4


def test_an_unreadable_process_fails_its_own_container_only(fake: FakeProc) -> None:
    fake.add(501, ppid=9, nspid=(501, 1), argv=["a"])
    fake.add(601, ppid=9, nspid=(601, 1), argv=["b"], cgroup=f"0::/kubepods/pod{UID}/{OTHER}")
    (fake.root / "601" / "status").write_text("Name:\tb\nNSpid:\tnot a number\n")
    got = procfs.scan(fake.root)
    assert got.failed == {ContainerRef(UID, OTHER): procfs.Incomplete.PROC_UNREADABLE}
    assert sorted(got.processes) == [501] and got.unplaced == 0


@pytest.mark.parametrize(
    ("moment", "listed"),
    [
        # After the cgroup read that placed it: the new process is read whole, under its own cgroup.
        ("placed", [(OTHER, "intruder", (501, 4))]),
        # After its directory was opened: every file comes from that directory, the old process's.
        ("opened", [(CID, "old", (501, 1))]),
    ],
)
def test_a_pid_reused_mid_read_never_mixes_two_processes(
    fake: FakeProc, monkeypatch: pytest.MonkeyPatch, moment: str, listed: list[tuple[object, ...]]
) -> None:
    # Process 501 of CID exits while it is read, and a process of another container gets pid 501:
    # its row is one process's or the other's, never the old cgroup with the new command line.
    fake.add(501, ppid=9, nspid=(501, 1), argv=["old"])
    real_open = os.open
    swapped = []
    trigger = f"{fake.root}/501/cgroup" if moment == "placed" else "cgroup"

    def open_then_reuse(path: str, flags: int, *args: object, **kw: object) -> int:
        fd = real_open(path, flags, *args, **kw)  # type: ignore[arg-type]
        if str(path) == trigger and not swapped:
            swapped.append(True)
            (fake.root / "501").rename(fake.root / "old-501")
            fake.add(501, ppid=9, nspid=(501, 4), argv=["intruder"], cgroup=f"0::/kubepods/pod{UID}/{OTHER}")
        return fd

    monkeypatch.setattr(procfs.os, "open", open_then_reuse)
    got = procfs.scan(fake.root)
    monkeypatch.undo()
    assert swapped
    assert [(p.container.container_id, p.args, p.nspid) for p in got.processes.values()] == listed


def test_a_real_process_read_through_its_open_directory_cannot_be_another_once_it_exits() -> None:
    """The real kernel's side of the test above: once the process behind an open /proc/<pid>
    directory has exited and been reaped (its pid free for the next process), every read through
    that directory fails (ESRCH) instead of reading whoever gets the pid, so `read_process` sees
    it gone; before that, the same reads give the process's own row."""
    child = subprocess.Popen(["sleep", "60"])
    # Popen returns once exec has passed the point of no return (its close-on-exec pipe closed),
    # which can be before the kernel has set up the new command line: wait for it.
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{child.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    fd = os.open(f"/proc/{child.pid}", os.O_RDONLY | os.O_DIRECTORY)
    try:
        ref = ContainerRef(pod_uid="u", container_id="c")
        row = procfs.read_process(fd, child.pid, ref, procfs.uptime_s(Path("/proc")))
        assert row is not None and row.args == "sleep 60"
        child.kill()
        child.wait()  # reaped: the pid may now be handed to a new process
        with pytest.raises(procfs._GONE):
            procfs.read_process(fd, child.pid, ref, procfs.uptime_s(Path("/proc")))
    finally:
        os.close(fd)
        if child.poll() is None:
            child.kill()
            child.wait()


AGENT_UID = 65533  # the DaemonSet's runAsUser/runAsGroup (templates/controller/agent.yaml.j2)


def _scan_as(uid: int, ref: ContainerRef) -> dict[str, object]:
    """procfs.scan of the real /proc in a child process running as `uid`:`uid`, with no
    capabilities and no supplementary groups (as the agent's container runs)."""
    import json

    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's result is read from the pipe
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # every uid non-zero: the kernel clears the capabilities
            got = procfs.scan(Path("/proc"), lambda x: x == ref)
            rows = [[p.pid, p.ppid, p.state, p.command] for p in procfs.rows(got.processes.values(), "p/c")]
            out = {"rows": rows, "failed": len(got.failed), "unplaced": got.unplaced, "uid": os.geteuid()}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(child, 0)
    return dict(json.loads(data))


def test_the_agents_own_uid_reads_every_containers_rows_as_root_does(
    container_cgroup: tuple[Path, ContainerRef],
) -> None:
    # Processes of root and of the controller's uid 65532 in a real pid namespace; the agent's
    # uid, without capabilities, reads the same rows as root: nothing it reads needs privilege.
    leaf, ref = container_cgroup
    script = (
        f"echo 0 > {leaf / 'cgroup.procs'}; sleep 1000 & "
        "python3 -c 'import ctypes, os, time; ctypes.CDLL(None).mlockall(1); "
        "os.setresgid(65532, 65532, 65532); os.setresuid(65532, 65532, 65532); time.sleep(1000)' & wait"
    )
    ns = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script])
    try:
        _wait_for_rows(leaf, 3)
        deadline = time.monotonic() + 20  # python's start, mlockall and setresuid take a while under load
        while True:
            as_root = procfs.scan(Path("/proc"), lambda x: x == ref)
            rows = procfs.rows(as_root.processes.values(), "p/c")
            want = [[p.pid, p.ppid, p.state, p.command] for p in rows]
            locked = any("L" in s for _, _, s, _ in want)  # VmLck read from status
            if (len(want) == 3 and locked) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(want) == 3 and locked, want
        got = _scan_as(AGENT_UID, ref)
        assert got == {"rows": want, "failed": 0, "unplaced": 0, "uid": AGENT_UID}
    finally:
        ns.kill()
        ns.wait()


def test_only_the_processes_of_a_listed_pod_are_opened(
    fake: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A whole pod listed (shared pid namespace): its sandbox is read; the node's other processes
    # cost the one cgroup read that places them, no directory opened.
    pod = f"0::/kubepods/pod{UID}"
    other = "0::/kubepods/pod" + "9" * 8 + "-0000-4000-8000-000000000000"
    fake.add(501, ppid=9, nspid=(501, 1), cgroup=f"{pod}/{'e' * 64}", argv=["/pause"])
    fake.add(502, ppid=9, nspid=(502, 2), cgroup=f"{pod}/{CID}", argv=["train"])
    for pid in range(600, 610):
        fake.add(pid, ppid=9, nspid=(pid, 1), cgroup=f"{other}/{OTHER}", argv=["x"])
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *args: object, **kw: object) -> int:
        if flags & os.O_DIRECTORY:
            opened.append(str(path).rsplit("/", 1)[-1])
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(procfs.os, "open", counting_open)
    got = procfs.scan(fake.root, lambda ref: ref.container_id == CID, whole_pods_of=[CID])
    monkeypatch.undo()
    assert sorted(got.processes) == [501, 502]
    assert sorted(opened) == ["501", "502"]
