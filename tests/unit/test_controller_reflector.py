"""The list+watch cache against a local fake apiserver: initial list, ADDED/MODIFIED/DELETED events,
bookmarks, and a 410 Gone (expired resourceVersion) that forces a relist instead of silently
missing deletes."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ghostgpu.controller.kube import DEPLOYMENTS, Reflector


def dep(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "spec": {}}


class FakeApiserver:
    """Scripted: each list returns `lists[i]`; each watch streams `watches[i]` then closes."""

    def __init__(self) -> None:
        self.lists: list[dict] = []
        self.watches: list[list[dict]] = []
        self.requests: list[dict[str, list[str]]] = []


@pytest.fixture
def apiserver() -> Iterator[tuple[str, FakeApiserver]]:
    fake = FakeApiserver()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            q = urllib.parse.parse_qs(url.query)
            if url.path.startswith("/version"):
                body = json.dumps({"major": "1", "minor": "35", "gitVersion": "v1.35.4"}).encode()
                self._send(body)
                return
            fake.requests.append(q)
            if q.get("watch") == ["true"]:
                events = fake.watches.pop(0) if fake.watches else []
                body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
            else:
                body = json.dumps(fake.lists.pop(0) if fake.lists else {"items": [], "metadata": {}}).encode()
            self._send(body)

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", fake
    server.shutdown()
    server.server_close()


async def test_list_watch_events_and_relist_on_410(apiserver: tuple[str, FakeApiserver]) -> None:
    import kr8s.asyncio

    url, fake = apiserver
    fake.lists = [
        {"items": [dep("a", "10"), dep("b", "11")], "metadata": {"resourceVersion": "11"}},
        # after the 410: the world changed while we were not watching (b deleted, c created)
        {"items": [dep("a", "30"), dep("c", "31")], "metadata": {"resourceVersion": "31"}},
    ]
    fake.watches = [
        [
            {"type": "MODIFIED", "object": dep("a", "12")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}},
            {"type": "ADDED", "object": dep("d", "14")},
            {"type": "DELETED", "object": dep("d", "15")},
        ],
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
    ]
    api = await kr8s.asyncio.api(url=url)
    changes = 0

    def changed() -> None:
        nonlocal changes
        changes += 1

    r = Reflector(api, DEPLOYMENTS, label_selector="ghostgpu.io/tracked=true", on_change=changed)
    task = asyncio.create_task(r.run())
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if len(fake.requests) >= 5:
                break
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert sorted(name for _, name in r.store) == ["a", "c"], "the relist replaced the cache: b is gone"
    assert r.store[("ns", "a")]["metadata"]["resourceVersion"] == "30"
    assert r.store[("ns", "a")]["kind"] == "Deployment", "list items get their kind"
    lists = [q for q in fake.requests if "watch" not in q]
    watches = [q for q in fake.requests if q.get("watch") == ["true"]]
    assert len(lists) >= 2, "410 Gone must trigger a relist"
    assert all(q["labelSelector"] == ["ghostgpu.io/tracked=true"] for q in fake.requests)
    assert watches[0]["resourceVersion"] == ["11"], "the watch starts at the list's resourceVersion"
    assert watches[1]["resourceVersion"] == ["15"], "a closed stream resumes from the last event"
    assert changes >= 5
