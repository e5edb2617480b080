"""Process tables the e2e tests script into kwok pods (what procps's `ps` would print there)."""

from __future__ import annotations

from ghostgpu.devcluster.kwok_exec import ProcessRow


def rows(*procs: tuple[int, str, str]) -> list[ProcessRow]:
    """(pid, stat, command line) rows; pid 1 is the entrypoint, the rest its children."""
    return [ProcessRow(pid=p, stat=s, args=a) for p, s, a in procs]


LIVE = rows(
    (1, "Ss", "/bin/sh -c python train.py"), (12, "Rl", "python train.py"), (40, "Sl", "pt_data_worker")
)
# A batch gap: zero utilization, but the trainer lives and a worker writes a checkpoint (D).
GAP = rows(
    (1, "Ss", "/bin/sh -c python train.py"), (12, "Sl", "python train.py"), (40, "D", "pt_data_worker")
)
# `train.py; sleep infinity` after training: a shell and a holder, no work.
FINISHED = rows((1, "Ss", "/bin/sh -c python train.py; sleep infinity"), (77, "S", "sleep infinity"))
# The trainer died and its parent never reaped it.
ZOMBIE = rows((1, "Ss", "/bin/sh -c python train.py"), (12, "Z", "[python] <defunct>"))
NOTEBOOK = rows(
    (1, "Ss", "tini -- start-notebook.sh"),
    (8, "Sl", "jupyter-lab"),
    (31, "Sl", "python -m ipykernel_launcher"),
)
# A periodic job between two runs: its shell loop waits on a finite sleep (a timer: live work).
PERIODIC = rows(
    (1, "Ss", "/bin/sh -c while true; do python job.py; sleep 3600; done"), (90, "S", "sleep 3600")
)
