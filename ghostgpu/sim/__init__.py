"""Synthetic ghost-occupancy fleet and the `ghostgpu bench` benchmark (DESIGN §5)."""
