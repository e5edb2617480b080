"""The list+watch cache of one resource type (`Reflector`), as the controller and the node agent keep
them: list (streamed on the watch itself where the apiserver can, else in pages), then watch from
the list's resourceVersion (bookmarks on); on 410 Gone or a broken stream it lists again, so the
cache never silently misses a delete. This is how the controller *watches* (never polls)
namespaces, tracked workloads, pods and nodes.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from kr8s._exceptions import ServerError

from ghostgpu.controller.kube import ResourceType, status_of

log = logging.getLogger("ghostgpu.controller.kube")

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class StreamedListUnsupported(Exception):
    """The apiserver refused or ignored `sendInitialEvents` (its WatchList feature is off)."""


class Reflector:
    """A list+watch cache of one resource type: `store` maps (namespace, name) -> object.

    The list is streamed when the apiserver can (a watch with `sendInitialEvents=true`, WatchList,
    on by default from Kubernetes 1.34): one request whatever the count, objects parsed one by one
    instead of pages of 500 held at once. At 6,250 nodes a relist was 13 paged requests; streamed it
    is one. An apiserver that refuses it (422/400) or ignores it (a change or a plain bookmark before
    the end-of-list bookmark) gets paged lists from then on."""

    def __init__(
        self,
        api: Any,
        rtype: ResourceType,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.api = api
        self.rtype = rtype
        self.label_selector = label_selector
        self.field_selector = field_selector  # e.g. spec.nodeName=<node>: the node agent's own pods
        self.transform = transform or (lambda o: o)
        self.on_change = on_change
        self.store: dict[tuple[str, str], Any] = {}
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.streamed_lists = True  # until the apiserver shows it cannot

    def _key(self, obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return (meta.get("namespace", ""), meta.get("name", ""))

    def _selectors(self) -> dict[str, str]:
        out = {}
        if self.label_selector:
            out["labelSelector"] = self.label_selector
        if self.field_selector:
            out["fieldSelector"] = self.field_selector
        return out

    def _listed(self, items: dict[tuple[str, str], Any], resource_version: str | None) -> None:
        self.store = items
        self.resource_version = resource_version
        self.synced.set()
        if self.on_change:
            self.on_change()

    def _item(self, obj: dict[str, Any]) -> Any:
        # List items carry no kind/apiVersion; Events need them in involvedObject.
        obj.setdefault("kind", self.rtype.kind)
        obj.setdefault("apiVersion", self.rtype.version)
        return self.transform(obj)

    async def _list(self) -> None:
        params: dict[str, Any] = {"limit": 500, **self._selectors()}
        items: dict[tuple[str, str], Any] = {}
        while True:
            async with self.api.call_api(
                "GET", version=self.rtype.version, url=self.rtype.plural, params=params
            ) as resp:
                body = orjson.loads(resp.content)  # 500 pods per page: the stdlib parser is ~2x slower
            for obj in body.get("items") or []:
                items[self._key(obj)] = self._item(obj)
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                break
            params["continue"] = cont
        self._listed(items, (body.get("metadata") or {}).get("resourceVersion"))

    def _watch_params(self, streamed_list: bool) -> dict[str, Any]:
        params: dict[str, Any] = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            # Like client-go's reflector: 5-10 min at random, so the many watches of one controller
            # do not all end (and resume) at once, and resume half as often as at a fixed 4 min.
            "timeoutSeconds": random.randint(300, 600),
            **self._selectors(),
        }
        if streamed_list:
            # No resourceVersion: a consistent list, then the changes after it on the same stream.
            params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
        else:
            params["resourceVersion"] = self.resource_version
        return params

    async def _watch(self, streamed_list: bool = False) -> bool:
        """Watch until the server ends the stream; with `streamed_list`, list first on the same
        stream. Returns False when a relist is needed."""
        initial: dict[tuple[str, str], Any] | None = {} if streamed_list else None
        try:
            async with self.api.call_api(
                "GET",
                version=self.rtype.version,
                url=self.rtype.plural,
                params=self._watch_params(streamed_list),
                stream=True,
                timeout=None,
            ) as resp:
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    event = orjson.loads(line)  # every pod change in the cluster passes here
                    etype, obj = event.get("type"), event.get("object") or {}
                    if etype == "ERROR":
                        # 410 Gone: our resourceVersion is too old; anything else: start over too.
                        log.info(
                            "watch ended by the apiserver, relisting",
                            extra={
                                "resource": self.rtype.plural,
                                "status": obj.get("code"),
                                "reason": obj.get("reason"),
                            },
                        )
                        return False
                    meta = obj.get("metadata") or {}
                    if initial is not None:
                        if (
                            etype == "BOOKMARK"
                            and (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true"
                        ):
                            self._listed(initial, meta.get("resourceVersion"))
                            initial = None
                            continue
                        if etype != "ADDED":
                            raise StreamedListUnsupported(f"a {etype} event before the end of the list")
                        initial[self._key(obj)] = self._item(obj)
                        continue
                    rv = meta.get("resourceVersion")
                    if rv:
                        self.resource_version = rv
                    if etype == "BOOKMARK":
                        continue
                    key = self._key(obj)
                    if etype == "DELETED":
                        self.store.pop(key, None)
                    else:
                        self.store[key] = self.transform(obj)
                    if self.on_change:
                        self.on_change()
        except ServerError as exc:
            if streamed_list and status_of(exc) in (400, 422):
                raise StreamedListUnsupported(f"HTTP {status_of(exc)}") from exc
            raise
        if initial is not None:
            # Ended inside its list without an error: not a server that streams lists as asked.
            raise StreamedListUnsupported("the stream ended before the end of the list")
        return True

    async def run(self, listed: bool = False) -> None:
        """Keep the cache in step with the apiserver for ever; `listed`: the cache was just listed
        (its resourceVersion set), so the first step is a watch from there, not another list."""
        loop = asyncio.get_running_loop()
        backoff = 0.5
        need_list = not listed
        while True:
            started = loop.time()
            try:
                if need_list and self.streamed_lists:
                    need_list = not await self._watch(streamed_list=True)
                else:
                    if need_list:
                        await self._list()
                    need_list = not await self._watch()
            except asyncio.CancelledError:
                raise
            except StreamedListUnsupported as exc:
                log.info(
                    "the apiserver does not stream lists, listing in pages",
                    extra={"resource": self.rtype.plural, "error": str(exc)},
                )
                self.streamed_lists = False
                need_list = True
                continue
            except Exception as exc:  # network, 5xx, auth: relist after a jittered backoff
                log.warning(
                    "watch failed, relisting",
                    extra={"resource": self.rtype.plural, "error": f"{type(exc).__name__}: {exc}"},
                )
                need_list = True
            if need_list and loop.time() - started < 1.0:
                # Failed or ended at once: do not hammer the apiserver with lists.
                await asyncio.sleep(backoff + random.uniform(0, backoff))
                backoff = min(backoff * 2, 30.0)
            else:
                backoff = 0.5
