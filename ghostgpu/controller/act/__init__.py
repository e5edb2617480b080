"""Act: the leader's writes.

`Actor.act` (actor.py) is the room's one entry point: verdict annotations and Events, eviction,
escalation. Stops go through the workload's actuator row (stopping.py: scale with its replica
record, or stops.py: an annotation or field with its record), guarded by the GitOps pre-flight
(gitops.py, gitops_rules.py) and the revert guard (revert_guard.py, stopspec.py).
"""
