"""Sweeps: `fleet sweep`. Owns the spec (`spec.py`), the sweep folder (`layout.py`), a trial's
schedule and command line (`plan.py`), a trial as a real `fleet launch` run (`trial.py`), what
a trial's telemetry says (`metric.py`), the pruning rule (`pruning.py`), the honest champion
(`champion.py`), the controller that runs the study (`controller.py`) and what a person reads
(`status.py`, `report.py`, `cli.py`).

May import `telemetry`, `trainer.config`, `trainer.data` (the held-out bytes, no mlx),
`trainer.launch.plan` (the hostfile), `trainer.progress` (durations),
`trainer.checkpoint.catalog` and Optuna (the `sweep` extra); never mlx: the controller starts
trials but trains nothing itself.
"""
