"""Observe: watch caches -> eligible workloads -> one batched signal read -> what each shows.

`Observer.observe` (observer.py) is the room's one entry point. `evidence.py` keeps each
workload's memory between polls (sample ring, artifact history) and assembles the `Evidence` the
judge room judges. Processes come through `signals.processes.ProcessSource` (exec today).
"""
