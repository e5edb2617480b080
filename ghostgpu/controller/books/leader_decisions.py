"""GET /decisions answers with the leader's decision log on every replica.

Only the leader writes the decision log (ghostgpu.controller.books.decisions), yet the Service in
front of the replicas sends a request to any of them. So a follower fetches the log from the leader,
at the address the leader writes into the Lease (ghostgpu.io/leader-address, LeaderElector), and
answers with it: `ghostgpu report` reads the same history through the Service, a port-forward to
any pod, or the leader itself. A redirect would not do: the pod address it names is not reachable
from where a port-forward or an Ingress puts the client.

`?local=1` asks a replica for its own file, and only the leader has one to give: the fetch sends it,
so a request is proxied at most once even while two replicas disagree about who leads (a Lease
changing hands). With no leader to ask, the answer is 503 with a line that says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx

NDJSON = "application/x-ndjson"
TEXT = "text/plain; charset=utf-8"
# Inside the follower's own exchange, which its server ends at CONNECTION_TIMEOUT_S (15 s).
FETCH_TIMEOUT_S = 10.0

Answer = tuple[int, str, bytes]


@dataclass
class LeaderDecisions:
    """The /decisions handler: own log when leading, else the leader's, fetched."""

    read_own: Callable[[], bytes]
    is_leader: Callable[[], bool]
    leader_address: Callable[[], str | None]
    holder: Callable[[], str | None]
    identity: str
    timeout_s: float = FETCH_TIMEOUT_S

    async def __call__(self, target: str) -> Answer:
        local = parse_qs(urlsplit(target).query).get("local", [""])[0] in ("1", "true")
        if self.is_leader():
            return 200, NDJSON, self.read_own()
        holder = self.holder()
        if local:
            return _unavailable(f"{self.identity} is not the leader (the Lease names {holder or 'nobody'})")
        address = self.leader_address()
        if address is None:  # nobody holds it, the holder gave no address, or it stopped renewing
            return _unavailable(
                f"{self.identity} is not the leader and the Lease names no live leader with an address "
                f"(holder: {holder or 'nobody'}); retry in a few seconds"
            )
        url = f"http://{address}/decisions?local=1"
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                r = await client.get(url)
        except httpx.HTTPError as exc:
            return _unavailable(f"{self.identity} cannot fetch the leader's log from {url}: {exc}")
        if r.status_code != 200:
            return _unavailable(f"the leader {holder} at {address} answered {r.status_code}: {r.text[:300]}")
        return 200, NDJSON, r.content


def _unavailable(why: str) -> Answer:
    return 503, TEXT, why.encode()
