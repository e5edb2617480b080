"""The node agent's idle-session facts (ghostgpu/agent/idle_facts.py): the class, the youngest
process, running processes, terminal wakeups and monitor CPU, on rows written here and on a real
tmux session read from this machine's /proc."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ghostgpu.agent import procfs
from ghostgpu.agent.cgroups import ContainerRef
from ghostgpu.agent.idle_facts import IdleFactsCollector, idle_facts
from ghostgpu.agent.scan import ContainerKey, ScanResult, Seen
from ghostgpu.idle_policy import SessionClass
from ghostgpu.verdict import ProcessCounts

REF = ContainerRef("uid", "c" * 64)
HZ = os.sysconf("SC_CLK_TCK")


def proc(
    pid: int, args: str, *, ppid: int = 1, stat: str = "S", age: int = 7200, **kw: object
) -> procfs.HostProcess:
    return procfs.HostProcess(
        pid=pid, ppid=ppid, nspid=(pid,), container=REF, stat=stat, elapsed_s=age, args=args, **kw
    )


def test_an_idle_kernel_is_a_notebook_with_nothing_new_or_running() -> None:
    facts = idle_facts(
        [
            proc(1, "tini -- start-notebook.sh", ppid=0),
            proc(7, "/opt/conda/bin/python3 /opt/conda/bin/jupyter-lab --ip=0.0.0.0"),
            proc(40, "/opt/conda/bin/python3 -m ipykernel_launcher -f /tmp/k.json", ppid=7, age=3600),
        ]
    )
    assert facts is not None
    assert facts.session_class is SessionClass.NOTEBOOK
    assert (facts.newest_start_age_s, facts.running, facts.tty_wakeups) == (3600, 0, 0)


def test_a_notebook_server_answering_a_tab_is_no_worker_but_its_kernel_and_terminals_are() -> None:
    def notebook(server: str, kernel: str, shell: str = "S") -> list[procfs.HostProcess]:
        return [
            proc(1, "tini -- start-notebook.sh", ppid=0),
            proc(7, "/opt/conda/bin/python3 /opt/conda/bin/jupyter-lab --ip=0.0.0.0", stat=server),
            proc(40, "/opt/conda/bin/python3 -m ipykernel_launcher -f /tmp/k.json", ppid=7, stat=kernel),
            proc(50, "/bin/bash -l", ppid=7, stat=shell, tty=True),  # a Jupyter terminal
        ]

    def running(procs: list[procfs.HostProcess]) -> int:
        facts = idle_facts(procs)
        assert facts is not None and facts.session_class is SessionClass.NOTEBOOK
        return facts.running

    # Caught answering an open tab's heartbeat: the front-end server's own work, not the session's.
    assert running(notebook(server="R", kernel="S")) == 0
    # A cell computing, or a command in the notebook's terminal, is work.
    assert running(notebook(server="S", kernel="R")) == 1
    assert running(notebook(server="R", kernel="S", shell="R")) == 1
    # Outside a notebook a server's running process counts: a model server answering is its work.
    served = idle_facts([proc(1, "tini -- uvicorn app:api", ppid=0), proc(2, "uvicorn app:api", stat="R")])
    assert served is not None and served.session_class is SessionClass.SERVER and served.running == 1
    assert served.frontend_cpu_s is None


def test_a_notebook_front_end_s_own_cpu_is_read_apart_never_its_children_s() -> None:
    facts = idle_facts(
        [
            proc(1, "tini -- start-notebook.sh", ppid=0, cpu_ticks=HZ, own_cpu_ticks=HZ),
            # 2 s of its own, 600 s with the kernels it reaped (which computed: work, not its own)
            proc(7, "jupyter-lab --ip=0.0.0.0", cpu_ticks=600 * HZ, own_cpu_ticks=2 * HZ),
            proc(
                40,
                "python3 -m ipykernel_launcher -f /tmp/k.json",
                ppid=7,
                cpu_ticks=50 * HZ,
                own_cpu_ticks=50 * HZ,
            ),
        ]
    )
    assert facts is not None and facts.frontend_cpu_s == pytest.approx(2.0)
    key = ContainerKey("ml", "nb-0", "u1", "main")
    result = ScanResult(
        timestamp=1_800_000_000.0, containers={key: Seen(ProcessCounts(), (), facts)}, scanned_pids=3
    )
    registry = CollectorRegistry()
    registry.register(IdleFactsCollector(lambda: result))
    rows = [
        line for line in generate_latest(registry).decode().splitlines() if "frontend_cpu_seconds{" in line
    ]
    assert len(rows) == 1 and rows[0].endswith(" 2.0"), rows


def test_watch_and_what_it_starts_are_monitors() -> None:
    facts = idle_facts(
        [
            proc(1, "sleep infinity", ppid=0),
            proc(9, "watch nvidia-smi", cpu_ticks=3 * HZ, tty=True, wakeups=900),
            proc(200, "sh -c nvidia-smi", ppid=9, age=0, stat="R", tty=True),
            proc(201, "nvidia-smi", ppid=200, age=0, stat="R", cpu_ticks=HZ // 10, tty=True),
        ]
    )
    assert facts is not None and facts.session_class is SessionClass.MONITOR
    # Its children are new and running, its own wakeups count: none of it is activity.
    assert (facts.running, facts.tty_wakeups) == (0, 0)
    assert facts.newest_start_age_s == 7200  # sleep infinity's; the monitor's children aside
    assert facts.monitor_cpu_s == pytest.approx(3.1, abs=0.02)


def test_a_shell_on_a_terminal_and_tmux() -> None:
    facts = idle_facts(
        [
            proc(1, "sleep infinity", ppid=0),
            proc(20, "tmux new -d -s work", wakeups=5000),  # the server redraws: not counted
            proc(21, "-bash", ppid=20, tty=True, wakeups=42, stat="Ss+"),
        ]
    )
    assert facts is not None and facts.session_class is SessionClass.TERMINAL
    assert facts.tty_wakeups == 42


def test_an_unknown_program_gets_no_facts_and_a_script_shell_is_no_terminal() -> None:
    assert idle_facts([proc(1, "python train.py", ppid=0)]) is None
    assert idle_facts([proc(1, "sh -c sleep infinity", ppid=0), proc(2, "sleep infinity")]) is None


def test_the_series_are_exported_only_for_containers_with_facts() -> None:
    key = ContainerKey("ml", "nb-0", "u1", "main")
    other = ContainerKey("ml", "train-0", "u2", "main")
    facts = idle_facts([proc(1, "python3 -m ipykernel_launcher -f k.json", ppid=0, age=100)])
    result = ScanResult(
        timestamp=1_800_000_000.0,
        containers={key: Seen(ProcessCounts(work=1), (), facts), other: Seen(ProcessCounts(work=1), ())},
        scanned_pids=10,
    )
    registry = CollectorRegistry()
    registry.register(IdleFactsCollector(lambda: result))
    text = generate_latest(registry).decode()
    # Three series for the notebook (no monitor, no front-end: neither series), none for the training job.
    rows = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 3, rows
    newest = next(line for line in rows if line.startswith("ghostgpu_agent_container_newest_start_seconds{"))
    assert 'class="notebook"' in newest
    assert newest.endswith(("1.7999999e+09", "1.7999999e+9"))  # newest start: the scan time - 100 s
    assert "monitor_cpu" not in "".join(rows) and "frontend_cpu" not in "".join(rows)
    assert "train-0" not in text


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_keystroke_into_a_real_tmux_pane_wakes_its_shell() -> None:
    """What the agent reads of a real terminal, from this machine's /proc: the pane's shell has a
    controlling terminal, sleeps while nobody types, and wakes for each key."""
    sock = f"/tmp/ghostgpu-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-S", sock]
    subprocess.run([*tmux, "new-session", "-d", "-s", "t", "sh"], check=True, timeout=10)
    try:
        pane = int(
            subprocess.run(
                [*tmux, "display", "-p", "#{pane_pid}"],
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout
        )
        uptime = procfs.uptime_s(Path("/proc"))

        def read() -> procfs.HostProcess:
            fd = os.open(f"/proc/{pane}", os.O_RDONLY | os.O_DIRECTORY)
            try:
                hp = procfs.read_process(fd, pane, REF, uptime)
            finally:
                os.close(fd)
            assert hp is not None
            return hp

        time.sleep(0.5)
        before = read()
        time.sleep(1.0)
        quiet = read()
        subprocess.run([*tmux, "send-keys", "-t", "t", "true", "Enter"], check=True, timeout=10)
        time.sleep(0.5)
        typed = read()
        assert before.tty and quiet.tty
        assert quiet.wakeups == before.wakeups  # nobody typed: the shell slept in read()
        assert typed.wakeups > quiet.wakeups  # a key woke it
    finally:
        subprocess.run([*tmux, "kill-server"], timeout=10, check=False)
        Path(sock).unlink(missing_ok=True)


def test_a_node_scan_carries_the_facts_of_a_terminal_container(tmp_path: Path) -> None:
    """scan_node -> Seen.idle from a proc tree as the kernel writes it: tty_nr, CPU with reaped
    children, context switches."""
    from test_agent_procfs import FakeProc
    from test_agent_scan import IS_GPU, POLICY, cg, cid, key, pod

    from ghostgpu.agent.scan import scan_node

    node = FakeProc(tmp_path / "proc", uptime=10_000.0)
    node.add(100, ppid=1, nspid=(100, 1), cgroup=cg(1, cid(1)), argv=["sleep", "infinity"], start_s=1000.0)
    node.add(101, ppid=1, nspid=(101, 7), cgroup=cg(1, cid(1)), comm="bash", argv=["-bash"], start_s=4000.0)
    # The shell on /dev/pts/0 (tty_nr 34816), 40 ticks of CPU, 12 + 3 context switches.
    stat = (node.root / "101" / "stat").read_text().split()
    stat[6], stat[13], stat[14] = "34816", "30", "10"
    (node.root / "101" / "stat").write_text(" ".join(stat) + "\n")
    with (node.root / "101" / "status").open("a") as f:
        f.write("voluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n")
    got = scan_node(
        [pod("term", 1, {"main": {"gpu": "nvidia.com/gpu", "id": cid(1)}})], node.root, POLICY, IS_GPU, now=0
    )
    seen = got.containers[key("term", 1, "main")]
    assert isinstance(seen, Seen) and seen.idle is not None
    assert seen.idle.session_class is SessionClass.TERMINAL
    assert (seen.idle.tty_wakeups, seen.idle.running, seen.idle.newest_start_age_s) == (15, 0, 6000)


def test_a_process_s_own_cpu_leaves_out_the_children_it_reaped() -> None:
    """procfs.read_process on this machine: a shell that ran and reaped a busy child has the child's
    CPU in cpu_ticks (cutime) and not in own_cpu_ticks, what the front-end discount reads."""
    shell = subprocess.Popen(
        ["sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done & wait; exec sleep 30"]
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the child ran, was reaped, and the shell became `sleep` (same pid)
            if Path(f"/proc/{shell.pid}/comm").read_text().strip() == "sleep":
                break
            assert time.monotonic() < deadline, "the shell never reached its sleep"
            time.sleep(0.05)
        fd = os.open(f"/proc/{shell.pid}", os.O_RDONLY | os.O_DIRECTORY)
        try:
            p = procfs.read_process(fd, shell.pid, REF, procfs.uptime_s(Path("/proc")))
        finally:
            os.close(fd)
        assert p is not None
        assert p.cpu_ticks - p.own_cpu_ticks >= 5, (p.cpu_ticks, p.own_cpu_ticks)  # the child's, reaped
        assert p.own_cpu_ticks <= 2
    finally:
        shell.kill()
        shell.wait()
