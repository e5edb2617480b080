"""The list+watch cache against a local fake apiserver: initial list (streamed on the watch, or in
pages where the apiserver refuses or ignores that), ADDED/MODIFIED/DELETED events, bookmarks, and a
410 Gone (expired resourceVersion) that forces a relist instead of silently missing deletes."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ghostgpu.controller.kube import DEPLOYMENTS
from ghostgpu.controller.reflector import Reflector


def dep(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "spec": {}}


class FakeApiserver:
    """Scripted: each list returns `lists[i]`; each watch streams `watches[i]` then closes. A watch
    that asks for the list on its stream (sendInitialEvents) gets `refuse_streamed` (an HTTP status,
    as an apiserver with WatchList off answers) or, with 0, the next scripted watch."""

    def __init__(self) -> None:
        self.lists: list[dict] = []
        self.watches: list[list[dict]] = []
        self.requests: list[dict[str, list[str]]] = []
        self.refuse_streamed = 422


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
            if q.get("sendInitialEvents") == ["true"] and fake.refuse_streamed:
                self.send_response(fake.refuse_streamed)
                body = json.dumps(
                    {
                        "kind": "Status",
                        "code": fake.refuse_streamed,
                        "reason": "Invalid",
                        "message": "sendInitialEvents is off",
                    }
                ).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
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
            # The relist's request arrives before its answer fills the cache: wait for both.
            if len(fake.requests) >= 5 and ("ns", "c") in r.store:
                break
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert sorted(name for _, name in r.store) == ["a", "c"], "the relist replaced the cache: b is gone"
    assert r.store[("ns", "a")]["metadata"]["resourceVersion"] == "30"
    assert r.store[("ns", "a")]["kind"] == "Deployment", "list items get their kind"
    assert fake.requests[0].get("sendInitialEvents") == ["true"], "a streamed list is tried first"
    assert r.streamed_lists is False, "after a 422 the cache lists in pages"
    lists = [q for q in fake.requests if "watch" not in q]
    watches = [q for q in fake.requests if q.get("watch") == ["true"] and "sendInitialEvents" not in q]
    assert len(lists) >= 2, "410 Gone must trigger a relist"
    assert all(q["labelSelector"] == ["ghostgpu.io/tracked=true"] for q in fake.requests)
    assert watches[0]["resourceVersion"] == ["11"], "the watch starts at the list's resourceVersion"
    assert watches[1]["resourceVersion"] == ["15"], "a closed stream resumes from the last event"
    assert changes >= 5


def end_of_list(rv: str) -> dict:
    return {
        "type": "BOOKMARK",
        "object": {"metadata": {"resourceVersion": rv, "annotations": {"k8s.io/initial-events-end": "true"}}},
    }


async def run_until(r: Reflector, fake: FakeApiserver, requests: int) -> None:
    task = asyncio.create_task(r.run())
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if len(fake.requests) >= requests:
                break
        await asyncio.sleep(0.1)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_streamed_list_is_one_request_and_a_410_streams_it_again(
    apiserver: tuple[str, FakeApiserver],
) -> None:
    """The list arrives on the watch itself (WatchList): the cache is synced at the end-of-list
    bookmark, not before; changes follow on the same stream; after a 410 the whole state is streamed
    again and replaces the cache (a delete missed meanwhile is not kept)."""
    import kr8s.asyncio

    url, fake = apiserver
    fake.refuse_streamed = 0
    synced_with: list[list[str]] = []
    fake.watches = [
        [
            {"type": "ADDED", "object": dep("a", "10")},
            {"type": "ADDED", "object": dep("b", "11")},
            end_of_list("11"),
            {"type": "MODIFIED", "object": dep("a", "12")},
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}},
        ],
        [
            {"type": "ADDED", "object": dep("a", "30")},
            {"type": "ADDED", "object": dep("c", "31")},
            end_of_list("31"),
        ],
    ]
    api = await kr8s.asyncio.api(url=url)
    r = Reflector(api, DEPLOYMENTS, label_selector="ghostgpu.io/tracked=true")
    r.on_change = lambda: synced_with.append(sorted(name for _, name in r.store))
    await run_until(r, fake, 3)
    streamed = [q for q in fake.requests if q.get("sendInitialEvents") == ["true"]]
    assert len(streamed) >= 2 and not [q for q in fake.requests if "watch" not in q], "no paged list at all"
    for q in streamed:
        assert q["resourceVersionMatch"] == ["NotOlderThan"] and "resourceVersion" not in q, q
        assert q["labelSelector"] == ["ghostgpu.io/tracked=true"]
    assert synced_with[0] == ["a", "b"], "synced once, at the end of the list, with the whole list"
    assert sorted(name for _, name in r.store) == ["a", "c"], (
        "the second stream replaced the cache: b is gone"
    )
    assert r.store[("ns", "a")]["metadata"]["resourceVersion"] == "30"
    assert r.store[("ns", "c")]["kind"] == "Deployment", "listed objects get their kind"
    assert r.streamed_lists is True
    assert fake.requests[2]["resourceVersion"] == ["31"], "then a plain watch from the list's end"


@pytest.mark.parametrize(
    "ignored",
    [
        [{"type": "ADDED", "object": dep("a", "10")}, {"type": "MODIFIED", "object": dep("a", "11")}],
        [
            {"type": "ADDED", "object": dep("a", "10")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
        ],
        [{"type": "ADDED", "object": dep("a", "10")}],  # the stream ended inside the list
    ],
    ids=["a-change-before-the-end", "a-plain-bookmark", "ended-early"],
)
async def test_an_apiserver_that_ignores_a_streamed_list_gets_paged_lists(
    apiserver: tuple[str, FakeApiserver], ignored: list[dict]
) -> None:
    """Never synced on a half list: the partial state is dropped and the list is paged from then on."""
    import kr8s.asyncio

    url, fake = apiserver
    fake.refuse_streamed = 0
    fake.watches = [ignored, []]
    fake.lists = [{"items": [dep("a", "20"), dep("b", "21")], "metadata": {"resourceVersion": "21"}}]
    api = await kr8s.asyncio.api(url=url)
    seen: list[list[str]] = []
    r = Reflector(api, DEPLOYMENTS)
    r.on_change = lambda: seen.append(sorted(name for _, name in r.store))
    await run_until(r, fake, 3)
    assert r.streamed_lists is False
    assert seen and seen[0] == ["a", "b"], "the first sync is the paged list's"
    assert "watch" not in fake.requests[1] and fake.requests[2]["resourceVersion"] == ["21"]
