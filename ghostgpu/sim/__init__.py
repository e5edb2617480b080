"""Synthetic ghost-occupancy fleet and the `ghostgpu bench` benchmark (docs/design.md#benchmark)."""
