"""The instant-query answer read a slice at a time (iter_answer) is exactly the answer parsed whole:
same items, same order, same failures, whatever the labels hold and wherever the slices fall."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghostgpu.signals import prometheus
from ghostgpu.signals.prometheus import PrometheusError, iter_answer, iter_vector, vector_result
from ghostgpu.verdict import FailureReason

# Label values may hold what the slicing looks for: quotes, braces, brackets, the separator itself.
label_text = st.text(alphabet=st.sampled_from([*'ab-.{}[]",:\\ metric', "é", "\n"]), max_size=12)
label_name = st.sampled_from(["namespace", "pod", "metric", "ghostgpu_field"])
series = st.fixed_dictionaries(
    {
        "metric": st.dictionaries(
            st.sampled_from(["namespace", "pod", "metric", "ghostgpu_field"]), label_text
        ),
        "value": st.tuples(st.floats(0, 2e9), st.sampled_from(["0", "87", "1.5e3", "NaN", "+Inf"])).map(list),
    }
)


HEAD = b'{"status":"success","data":{"resultType":"vector","result":['


def prometheus_json(result: list, **extra: object) -> bytes:
    """Prometheus's own layout: compact, status first, then data (resultType, result)."""
    body = {"status": "success", "data": {"resultType": "vector", "result": result}, **extra}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def whole(content: bytes) -> list:
    return list(iter_vector(vector_result(json.loads(content))))


@settings(max_examples=300, deadline=None)
@given(
    result=st.lists(series, max_size=40),
    chunk=st.integers(1, 400),
    warnings=st.sampled_from([{}, {"warnings": ["PromQL info: ]}]"]}, {"infos": ["x"]}]),
)
def test_sliced_reading_equals_the_whole_answer(result: list, chunk: int, warnings: dict) -> None:
    content = prometheus_json(result, **warnings)
    assert list(iter_answer(content, chunk)) == whole(content)


def test_large_answer_is_read_in_many_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = prometheus._loads
    monkeypatch.setattr(prometheus, "_loads", lambda b: calls.append(len(b)) or real(b))
    result = [{"metric": {"namespace": "ns", "pod": f"p{i}"}, "value": [1.0, str(i)]} for i in range(20_000)]
    content = prometheus_json(result)
    got = list(iter_answer(content))
    assert [v for _, _, v in got] == [float(i) for i in range(20_000)]
    assert len(calls) > 3 and max(calls) < prometheus.CHUNK_BYTES + 200


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"2"]},'
            b'{"metric":{},"value":[1]},{"metric":{},"value":[1,"3"]}]}}',
            FailureReason.PARSE_ERROR,
        ),
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"2"]}',
            FailureReason.PARSE_ERROR,
        ),
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"2"]}]}}garbage',
            FailureReason.PARSE_ERROR,
        ),
        (b'{"status":"error","errorType":"bad_data","error":"parse error"}', FailureReason.HTTP_ERROR),
        (b'{"status":"success","data":{"resultType":"matrix","result":[]}}', FailureReason.PARSE_ERROR),
        (b"<html>proxy error</html>", FailureReason.PARSE_ERROR),
    ],
)
def test_a_malformed_answer_fails_as_a_whole(content: bytes, reason: FailureReason) -> None:
    with pytest.raises(PrometheusError) as info:
        list(iter_answer(content))
    assert info.value.failure.reason is reason


def test_an_empty_result_has_no_items() -> None:
    assert list(iter_answer(prometheus_json([]))) == []
