"""The reclaim controller (docs/design.md#rooms-and-doors, #signals-verdict-action): watches tracked
workloads, gathers signals, asks `ghostgpu.verdict.decide`, gates actions through
`ghostgpu.autonomy`, and owns every write to the cluster. Pure wiring (inventory, evidence
assembly, action planning, accounting, report) lives in modules that need no cluster so it is
unit-tested directly."""
