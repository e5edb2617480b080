"""`ghostgpu doctor`: does this cluster have what ghostgpu needs? One row per prerequisite."""
