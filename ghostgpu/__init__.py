"""ghostgpu: find GPU workloads that bypass Kueue, prove they are idle, reclaim them safely."""

__version__ = "0.1.0"
