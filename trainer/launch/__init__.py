"""The launcher: `fleet launch` and `fleet check`. Plans an attempt (`plan.py`), checks the
fleet (`check.py`), runs and watches mlx.launch (`supervisor.py`, `proctree.py`), holds the
lifeline every rank watches so that no run outlives its launcher (`lifeline.py`; mlx.launch's
output is spooled, `spool.py`, so that a stalled terminal never silences it) and restarts
from checkpoints (`restart.py`, `launcher.py`).

It starts ranks but is none: it imports no `mlx.core` (a rank's side of the check is
`trainer/probe.py`). May import `trainer.config`, `trainer.heartbeat`, `trainer.blas`,
`trainer.checkpoint.catalog`, `trainer.model.config`, `trainer.lock` and `telemetry`.
"""
