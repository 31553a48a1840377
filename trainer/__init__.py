"""The MLX trainer: data parallel, or tensor parallel with --parallel tensor.

The loop and its nouns sit here, where a reader looks first:
`train.py` (the loop, top to bottom), `config.py`, `run.py`, `step.py`, `controller.py`,
`commands.py`, `autopilot.py` with `costs.py` and `fixed_part.py`, `alerts.py`,
`distributed.py`, `optim.py`, `memory.py` (limits, budget, live set), `shard.py` (the
optimizer sharded in unequal shares), `lock.py` (one writer per run folder), `keeper.py` (what
rank 0 writes back), `flat.py` (the optimizer step over flat buffers), `parallel.py`
(tensor-parallel groups).

The wings, each with its own rules (see its docstring): `data/` (no mlx), `model/`,
`checkpoint/`, `launch/` (no mlx.core), `sweep/` (`fleet sweep`, no mlx).
"""
