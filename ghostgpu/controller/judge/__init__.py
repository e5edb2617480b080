"""Judge: evidence -> verdict -> plan, pure (no cluster calls).

`Judge.judge` (judge.py) is the room's one entry point and keeps the settled-plan memo;
`planner.py` turns a verdict into a plan through the risk gate; `recorded.py` reads the verdict a
workload carries from an earlier poll.
"""
