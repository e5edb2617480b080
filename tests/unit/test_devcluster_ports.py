"""Ports for devclusters that start at once on one host (one per test worker): never the same port
twice while a cluster may still be starting, and never in the kernel's ephemeral range, where an
outgoing connection can take a port before the server meant for it binds it (the CI failure
`listen tcp 127.0.0.1:46029: bind: address already in use` of containerd's stream server)."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ghostgpu.devcluster import procs


def test_ports_are_below_the_ephemeral_range(tmp_path: Path) -> None:
    low, _ = procs._ephemeral_range()
    ports = procs.free_ports(40, ledger=tmp_path / "ports.json")
    assert len(set(ports)) == 40
    assert all(procs._PORTS_BELOW <= p < low for p in ports)


def test_clusters_starting_at_once_get_disjoint_ports(tmp_path: Path) -> None:
    ledger = tmp_path / "ports.json"
    with ThreadPoolExecutor(6) as pool:
        sets = list(pool.map(lambda _: procs.free_ports(25, ledger=ledger), range(6)))
    every = [p for s in sets for p in s]
    assert len(every) == len(set(every)) == 150


def test_a_port_handed_out_is_held_then_released(tmp_path: Path) -> None:
    ledger = tmp_path / "ports.json"
    [first] = procs.free_ports(1, ledger=ledger, now=1000.0)
    held = procs.free_ports(3000, ledger=ledger, now=1000.0 + procs.PORT_HOLD_S - 1)
    assert first not in held
    assert str(first) in json.loads(ledger.read_text())
    procs.free_ports(1, ledger=ledger, now=1000.0 + 2 * procs.PORT_HOLD_S)
    assert str(first) not in json.loads(ledger.read_text())  # expired entries are dropped


def test_a_listening_port_is_never_handed_out(tmp_path: Path, monkeypatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", procs.free_ports(1, ledger=tmp_path / "a.json")[0]))
        s.listen()
        busy = s.getsockname()[1]
        draws = iter([busy, busy, busy + 1 if busy + 1 != busy else busy - 1])
        monkeypatch.setattr(procs.random.SystemRandom, "randint", lambda self, a, b: next(draws))
        assert procs.free_ports(1, ledger=tmp_path / "b.json") == [busy + 1]


def test_a_broken_ledger_is_started_over(tmp_path: Path) -> None:
    ledger = tmp_path / "ports.json"
    ledger.write_text("{not json")
    assert len(procs.free_ports(2, ledger=ledger)) == 2
