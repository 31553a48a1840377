"""Checkpoints: the manifest (`manifest.py`), a run's checkpoint folders (`catalog.py`: where,
which verify, `latest`, `best`, pruning, resume) and their arrays (`store.py`, the only part
that needs MLX).

May import: `telemetry`'s core (atomic writes, digests); `store.py` also mlx. `catalog.py` and
`manifest.py` import no mlx, so the launcher can find a run's newest checkpoint.
"""
