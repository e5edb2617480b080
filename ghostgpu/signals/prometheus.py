"""A minimal async client for the Prometheus HTTP API (`/api/v1/query`).

Why our own thin client: every way a query can go wrong must become a typed `SignalFailure`
reason (HTTP error, timeout, malformed body, `status: error`), and the query is sent as a POST form
so that a regex over hundreds of pod names never hits URL length limits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from ghostgpu.verdict import FailureReason, SignalFailure


def newest_sample_time(metrics: Sequence[str], matchers: str, by: str, at: float) -> str:
    """PromQL: per `by` group, the time of the newest sample at or before `at` of any series of
    `metrics` selected by `matchers`. Each metric's timestamp() is tagged before they are merged:
    timestamp() drops the metric name, and two metrics with one label set (dcgm-exporter's
    utilization and framebuffer series of a GPU) would otherwise be a duplicate the query rejects."""
    tagged = [
        f'label_replace(timestamp({m}{{{matchers}}} @ {at:.3f}), "ghostgpu_metric", "{i}", "", "")'
        for i, m in enumerate(metrics)
    ]
    return f"max by ({by}) ({' or '.join(tagged)})"


# Sent with every query. VictoriaMetrics answers a query for a time within -search.latencyOffset
# (default 30 s) of its clock as of that much earlier, with the answer's timestamps moved forward
# to the time asked: a workload busy again for the last 30 s would still read idle, yet look fresh.
# `nocache=1` turns that off (every release since 2019; `latency_offset` refuses 0), at the price
# of its rollup cache, which an instant query over a window of seconds does not use. Prometheus,
# Thanos and Mimir ignore a parameter they do not know (docs/victoriametrics.md).
QUERY_PARAMS = {"nocache": "1"}


class PrometheusError(Exception):
    """A query failed as a whole; `failure` is what every affected workload records."""

    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.failure = SignalFailure(reason=reason, detail=detail[:200])


@dataclass(frozen=True, slots=True)
class VectorSample:
    """One series of an instant-vector result."""

    labels: dict[str, str]
    timestamp: float  # evaluation time of the instant query (not the sample's own time)
    value: float


def vector_result(body: Any) -> list[Any]:
    """The `data.result` list of an instant-query answer, its envelope checked (the items are not:
    see parse_vector and iter_vector). Raises PrometheusError like parse_vector."""
    if not isinstance(body, dict):
        raise PrometheusError(FailureReason.PARSE_ERROR, "response is not a JSON object")
    if body.get("status") != "success":
        err = f"{body.get('errorType', 'unknown')}: {body.get('error', 'no error text')}"
        raise PrometheusError(FailureReason.HTTP_ERROR, f"prometheus status {body.get('status')!r} {err}")
    if body.get("isPartial", False) is not False:
        # VictoriaMetrics' vmselect answers without the series of a storage node it could not
        # reach: a busy GPU's series missing beside an idle one's of the same pod would read idle.
        raise PrometheusError(
            FailureReason.OTHER, "partial answer (isPartial): a storage node did not answer"
        )
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise PrometheusError(FailureReason.PARSE_ERROR, "expected data.resultType == 'vector'")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError(FailureReason.PARSE_ERROR, "data.result is not a list")
    return result


def iter_vector(result: list[Any]) -> Iterator[tuple[float, dict[str, str], float]]:
    """(evaluation time, labels, value) per well-formed item, without building a VectorSample or
    copying its labels: the answer of a poll holds a series per tracked pod and field (10⁵ at
    50,000 pods), and this is the whole of what the controller needs from each. Same rules as
    parse_vector: a malformed item fails the whole answer (PARSE_ERROR), NaN/Inf are dropped."""
    isfinite = math.isfinite
    for item in result:
        try:
            labels = item["metric"]
            ts_raw, value_raw = item["value"]
            ts, value = float(ts_raw), float(value_raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise PrometheusError(FailureReason.PARSE_ERROR, f"malformed sample {item!r:.120}") from exc
        if type(labels) is not dict:
            raise PrometheusError(FailureReason.PARSE_ERROR, "metric labels are not an object")
        if isfinite(value):
            yield ts, labels, value


# Prometheus writes an instant vector as below, items in one array. A raw `"` never occurs inside
# a JSON string (it is escaped), so `},{"metric":` occurs only between two items, and `"]}]` only
# where the last item's value, the item and the array end.
_VECTOR_HEAD = b'{"status":"success","data":{"resultType":"vector","result":['
# VictoriaMetrics' cluster (vmselect) says whether every storage node answered; only a whole
# answer is read a slice at a time (a partial one fails in vector_result).
_WHOLE_VECTOR_HEAD = b'{"status":"success","isPartial":false,"data":{"resultType":"vector","result":['
_BETWEEN_ITEMS = b'},{"metric":'
_LAST_ITEM_END = b'"]}]'
CHUNK_BYTES = 1 << 18  # ~2,500 series parsed at a time


def iter_answer(
    content: bytes, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[float, dict[str, str], float]]:
    """(evaluation time, labels, value) of every well-formed item of an instant-query answer, read
    a slice of the array at a time: parsed whole, the answer for 50,000 pods is ~35 MB of Python
    objects at once (most of the controller's peak memory); a slice is ~2 MB, parsed by the same
    orjson. An answer in any other layout (or an error) is parsed whole, as before. The rules are
    iter_vector's: a malformed item or envelope fails the whole answer (PARSE_ERROR)."""
    end = content.rfind(_LAST_ITEM_END) + 3  # just past the last item's closing brace
    tail = content[end + 1 :]
    head = next((h for h in (_VECTOR_HEAD, _WHOLE_VECTOR_HEAD) if content.startswith(h)), None)
    if head is None or end < len(head) or not _valid_tail(tail):
        yield from iter_vector(vector_result(_loads(content)))
        return
    pos = len(head)
    while pos < end:
        cut = content.find(_BETWEEN_ITEMS, pos + chunk_bytes, end)
        cut = end if cut < 0 else cut + 1  # the slice ends with an item's closing brace
        items = _loads(b"[" + content[pos:cut] + b"]")
        if not isinstance(items, list):
            raise PrometheusError(FailureReason.PARSE_ERROR, "data.result is not a list")
        yield from iter_vector(items)
        pos = cut + 1  # past the comma


def _valid_tail(tail: bytes) -> bool:
    """What follows the result array: `}}`, or the rest of the envelope (`warnings`, `infos`)."""
    if tail == b"}}":
        return True
    if not (tail.startswith(b"},") and tail.endswith(b"}")):
        return False
    try:
        return isinstance(orjson.loads(b"{" + tail[2:]), dict)
    except ValueError:
        return False


def _loads(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except ValueError as exc:  # orjson.JSONDecodeError is one
        raise PrometheusError(FailureReason.PARSE_ERROR, f"response body is not JSON: {exc}"[:200]) from exc


def parse_vector(body: Any) -> tuple[float | None, list[VectorSample]]:
    """Parse an instant-query response body into samples.

    Returns (evaluation time if any sample carries one, samples). Raises PrometheusError with
    PARSE_ERROR for anything that is not a well-formed vector result, HTTP_ERROR for `status: error`.
    """
    result = vector_result(body)
    samples: list[VectorSample] = []
    eval_time: float | None = None
    for item in result:
        try:
            labels = item["metric"]
            ts_raw, value_raw = item["value"]
            ts, value = float(ts_raw), float(value_raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise PrometheusError(FailureReason.PARSE_ERROR, f"malformed sample {item!r:.120}") from exc
        if not isinstance(labels, dict):
            raise PrometheusError(FailureReason.PARSE_ERROR, "metric labels are not an object")
        eval_time = ts
        # NaN/Inf are not readings: drop them so that the series counts as missing (a failure).
        if math.isfinite(value):
            samples.append(
                VectorSample(labels={str(k): str(v) for k, v in labels.items()}, timestamp=ts, value=value)
            )
    return eval_time, samples


class PrometheusClient:
    """Async instant queries against one Prometheus base URL (e.g. http://127.0.0.1:9090)."""

    def __init__(
        self, base_url: str, *, timeout: float = 10.0, client: httpx.AsyncClient | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._owns_client = client is None

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def query(self, promql: str, *, at: float | None = None) -> tuple[float | None, list[VectorSample]]:
        """Run one instant query. Raises PrometheusError, never returns a partial answer."""
        return parse_vector(await self.query_body(promql, at=at))

    async def query_body(self, promql: str, *, at: float | None = None) -> Any:
        """Run one instant query; the decoded JSON answer of a 200 (envelope not yet checked)."""
        return _loads(await self.query_content(promql, at=at))

    async def query_content(
        self, promql: str, *, at: float | None = None, max_bytes: int | None = None
    ) -> bytes:
        """Run one instant query; the undecoded body of a 200 (see iter_answer). With `max_bytes`,
        a longer answer is cut off as it arrives and fails (never held whole)."""
        form = {"query": promql, **QUERY_PARAMS}
        if at is not None:
            form["time"] = f"{at:.3f}"
        try:
            async with self._client.stream(
                "POST", f"{self.base_url}/api/v1/query", data=form, timeout=self.timeout
            ) as resp:
                content = await _read_capped(resp, max_bytes)
        except httpx.TimeoutException as exc:
            raise PrometheusError(FailureReason.TIMEOUT, f"no answer within {self.timeout}s") from exc
        except httpx.HTTPError as exc:
            raise PrometheusError(FailureReason.HTTP_ERROR, f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            # Prometheus answers 400/422/503 with a JSON error body; keep its text for the evidence.
            try:
                body = orjson.loads(content)
            except ValueError:  # orjson.JSONDecodeError is one
                body = None
            text = content[:120].decode("utf-8", "replace")
            detail = body.get("error", "") if isinstance(body, dict) else text
            raise PrometheusError(FailureReason.HTTP_ERROR, f"HTTP {resp.status_code} {detail}".strip())
        return content


async def _read_capped(resp: httpx.Response, max_bytes: int | None) -> bytes:
    if max_bytes is None:
        return await resp.aread()
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise PrometheusError(
                FailureReason.OTHER,
                f"the answer is over {max_bytes} bytes (series of pods that do not exist in a "
                f"tracked namespace?): not read",
            )
        chunks.append(chunk)
    return b"".join(chunks)
