"""What one trial runs: its updates and evaluation points from the token budget, and its
`fleet launch` (or, for one rank, `fleet train`) command line."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, TrainConfig
from trainer.data.dataset_format import DatasetError, read_meta


@dataclass(frozen=True)
class TrialPlan:
    """A trial's schedule: `evals` evaluations, the last one after `updates` updates.

    The trainer evaluates every `eval_every` updates and the final model at the end, so the
    last evaluation measures the model after exactly the budget."""

    updates: int
    eval_every: int
    tokens_per_update: int

    @property
    def tokens(self) -> int:
        return self.updates * self.tokens_per_update

    def fraction(self, step: int) -> float:
        """How much of the budget a trial has spent at update `step`."""
        return step / self.updates


def seq_len_of(train: dict[str, Any]) -> int:
    """Tokens per row: the flag's, else the dataset's (read from dataset.json, no mlx)."""
    if train.get("seq_len"):
        return int(train["seq_len"])
    if train.get("synthetic"):
        raise ConfigError("a --synthetic sweep needs seq_len in [train]")
    try:
        return int(read_meta(Path(train["data"]))["seq_len"])
    except DatasetError as e:
        raise ConfigError(f"[train] data: {e}") from None


def world_of(spec) -> int:
    """Ranks of one trial: `ranks`, or the hostfile's hosts split over `concurrent` parts."""
    if not spec.fleet.hostfile:
        return spec.fleet.ranks
    from trainer.launch.plan import LaunchError, read_hostfile

    try:
        hosts, _ = read_hostfile(spec.fleet.hostfile)
    except LaunchError as e:
        raise ConfigError(str(e)) from None
    return len(hosts) // spec.fleet.concurrent


def trial_plan(spec, params: dict[str, Any]) -> TrialPlan:
    """The schedule of a trial with these searched values; raises ConfigError if the budget
    cannot hold one update per evaluation."""
    cfg = spec.base_config(**params)
    split = cfg.split(world_of(spec))
    per_update = sum(split) * cfg.accum * seq_len_of({**spec.train, **params})
    per_eval = math.ceil(spec.budget_tokens / (per_update * spec.evals))
    if spec.budget_tokens < per_update * spec.evals:
        raise ConfigError(
            f"[budget] tokens = {spec.budget_tokens:,} is less than {spec.evals} "
            f"evaluations of one update of {per_update:,} tokens each"
        )
    return TrialPlan(per_eval * spec.evals, per_eval, per_update)


def train_args(spec, params: dict[str, Any], run_dir: Path, seed: int, resume: bool) -> list[str]:
    """The trial's `fleet train` arguments: the spec's fixed flags, the trial's values, the
    budget's schedule, its folder and seed."""
    plan = trial_plan(spec, params)
    values: dict[str, Any] = {
        "checkpoint_every": plan.eval_every,  # a crash loses at most one evaluation's work
        "log_every": plan.eval_every,
        "project_name": spec.name,  # trackers group a sweep's trials (with --report-to)
        **spec.train,
        **params,
        "seed": seed,
        "updates": plan.updates,
        "eval_every": plan.eval_every,
        "run_dir": str(run_dir),
    }
    if resume:
        values["resume"] = "latest"
    return flags(values)


def flags(values: dict[str, Any]) -> list[str]:
    """`fleet train` flags for these fields (booleans as --x / --no-x)."""
    out = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{flag[2:]}")
        else:
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    return out


def command(spec, train: list[str], hostfile: str, port: int) -> list[str]:
    """The trial's command: `fleet launch ... -- train ...`; a one-rank trial on this
    machine runs `fleet train` itself (mlx.launch cannot form a ring of one)."""
    fleet = [sys.executable, "-m", "fleet.cli"]
    if not hostfile and spec.fleet.ranks == 1:
        return [*fleet, "train", *train]
    where = ["--hostfile", hostfile] if hostfile else ["-n", str(spec.fleet.ranks)]
    launch = [*where, "--starting-port", str(port), "--stop-grace", f"{spec.fleet.stop_grace:g}"]
    if spec.fleet.backend:
        launch += ["--backend", spec.fleet.backend]
    if spec.fleet.restarts:
        launch += ["--restarts", str(spec.fleet.restarts)]
    for e in spec.fleet.env:
        launch += ["--env", e]
    return [*fleet, "launch", *launch, "--", "train", *train]


def promoted(spec, params: dict[str, Any], seed: int, updates: int, run_dir: str) -> list[str]:
    """The `fleet train` (or `fleet launch ... -- train`) command line of a full run with
    these values, as a person would type it."""
    values = {**spec.train, **params, "seed": seed, "run_dir": run_dir}
    if updates:
        values["updates"] = updates
    train = ["train", *flags(values)]
    if not spec.fleet.hostfile and spec.fleet.ranks == 1:
        return ["fleet", *train]
    where = (
        ["--hostfile", spec.fleet.hostfile]
        if spec.fleet.hostfile
        else ["-n", str(spec.fleet.ranks)]
    )
    return ["fleet", "launch", *where, "--", *train]


def validate_values(spec, params: dict[str, Any]) -> TrainConfig:
    """The whole config of a trial, checked (a value that cannot run is a failed trial)."""
    cfg = spec.base_config(**params)
    cfg.validate()
    return cfg
