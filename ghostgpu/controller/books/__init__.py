"""Books: what the poll found and freed, counted.

`Books.keep` (books.py) once per poll on the leader: the decision log (decisions.py), the ghost
gauge, GPU-hours, the Kueue nudge. `accounting_from` (books.py, accounting.py) and the Kueue
reservation (reservation.py) after the poll, from app.py.
"""
