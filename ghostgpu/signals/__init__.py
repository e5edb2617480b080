"""Signal sources (docs/design.md#signals): each does I/O and returns the typed observations of
`ghostgpu.verdict` — a value or an explicit `SignalFailure`, never a silent zero. They never decide.

- `prometheus`: a small async client for the Prometheus HTTP API whose errors are failure reasons.
- `utilization`: one batched PromQL query per poll (utilization, sample timestamps, XIDs).
- `processes`: a fixed read-only argv executed in the container through the apiserver.
- `artifacts`: size of the declared output location (`file://` in the container, `s3://`).
- `faults`: container restarts and termination reasons from pod status (XIDs come with utilization).
"""
