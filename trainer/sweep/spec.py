"""A sweep's spec: a TOML file naming the search, the budget, the metric, pruning, the champion
and the fleet; parsed and checked here, before anything starts, with one-line errors.

    name = "lr-wd"                 # the folder: sweeps/lr-wd (or `folder = ...`)
    sampler = "tpe"                # grid, random or tpe (Optuna's samplers)
    trials = 12                    # search trials (grid: 0 = the whole grid)

    [train]                        # fixed `fleet train` flags of every trial
    data = "/tmp/fleet-data"
    depth = 2
    width = 64

    [search]                       # any `fleet train` flag
    lr = { low = 1e-4, high = 1e-2, log = true }
    weight_decay = { low = 0.0, high = 0.2 }
    optimizer = { values = ["adamw", "muon"] }

    [baseline]                     # optional: enqueued first (Optuna's enqueue_trial)
    lr = 2e-3

    [budget]
    tokens = 200_000               # per trial, the same for every trial
    evals = 8                      # evaluations over it (the pruner looks at these)

    [metric]
    name = "val_bpb"               # val_bpb (bits per byte) or val_loss (nats per token)
    direction = "minimize"

    [prune]
    rule = "median"                # median, halving or none
    warmup = 0.5                   # no pruning before this fraction of the budget
    diverge = 1.0                  # loss above this x the first update's: pruned (0 = never)

    [champion]
    top_k = 3                      # the best k are re-run on new seeds before one is crowned
    seeds = [1, 2]

    [fleet]                        # what `fleet launch` gets for each trial
    ranks = 1                      # ranks per trial on this machine (or hostfile = "...")
    concurrent = 1                 # trials side by side (a hostfile is split in as many parts)
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import FIELDS, ConfigError, TrainConfig, check_keys
from trainer.sweep.plan import trial_plan

SAMPLERS = ("grid", "random", "tpe")
METRICS = {
    "val_bpb": "validation bits per byte (comparable across tokenizers)",
    "val_loss": "validation loss in nats per token",
}
RULES = ("median", "halving", "none")
# No pruning in the first half of the budget: early on a cosine schedule ranks the low
# learning rates last, and they often finish first (the published log lost days to a gate
# that fired before runs converged).
WARMUP = 0.5
# Flags each trial gets from the sweep itself: a spec may not set them.
OWNED = ("run_dir", "updates", "eval_every", "resume", "stop_at", "resume_disagreeing")
# Flags a spec may set in [train] but never search: the champion's seeds are its own.
UNSEARCHABLE = ("seed", "data", "synthetic", "telemetry_port_base", "report_to", "project_name")
SECTIONS = {
    "": ("name", "folder", "sampler", "trials", "sampler_seed", "startup_trials"),
    "train": None,  # any fleet train flag, checked against TrainConfig
    "search": None,
    "baseline": None,
    "budget": ("tokens", "evals"),
    "metric": ("name", "direction"),
    "prune": ("rule", "warmup", "diverge", "min_trials", "reduction"),
    "champion": ("top_k", "seeds"),
    "fleet": (
        "ranks",
        "hostfile",
        "backend",
        "starting_port",
        "env",
        "concurrent",
        "stop_grace",
        "restarts",
    ),
}


class SpecError(ValueError):
    """A spec that cannot run; the message is one line naming the key and why."""


@dataclass(frozen=True)
class Param:
    """One searched flag: a float or int range (log-uniform with `log`), or a list of values."""

    name: str
    kind: str  # "float", "int" or "values"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    values: tuple[Any, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def describe(self) -> str:
        if self.kind == "values":
            return f"{self.flag} in {list(self.values)}"
        return f"{self.flag} {'log-' if self.log else ''}uniform in [{self.low:g}, {self.high:g}]"


@dataclass(frozen=True)
class Fleet:
    """Where trials run: `ranks` on this machine, or the hostfile's hosts; `concurrent` trials
    at once on disjoint parts of it."""

    ranks: int = 1
    hostfile: str = ""
    backend: str = ""
    starting_port: int = 0  # 0 = a free range for each trial
    env: tuple[str, ...] = ()
    concurrent: int = 1
    stop_grace: float = 30.0
    restarts: int = 0


@dataclass(frozen=True)
class Spec:
    """A parsed, checked sweep spec."""

    path: Path
    name: str
    folder: Path
    sampler: str
    trials: int
    sampler_seed: int
    startup_trials: int
    train: dict[str, Any]
    params: tuple[Param, ...]
    baseline: dict[str, Any]
    budget_tokens: int
    evals: int
    metric: str
    direction: str
    rule: str
    warmup: float
    diverge: float
    min_trials: int
    reduction: int
    top_k: int
    seeds: tuple[int, ...]
    fleet: Fleet
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def digest(self) -> str:
        """What makes two specs the same sweep: everything but the number of trials (a
        resumed sweep may be given more)."""
        body = {k: v for k, v in self.raw.items() if k != "trials"}
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def seed(self) -> int:
        """The seed of the search trials (the champion's re-runs take `seeds`)."""
        return int(self.train.get("seed", FIELDS["seed"].default))

    @property
    def minimize(self) -> bool:
        return self.direction == "minimize"

    def grid(self) -> dict[str, list[Any]]:
        """The grid sampler's search space: each flag's values."""
        return {p.name: list(p.values) for p in self.params}

    def grid_size(self) -> int:
        return math.prod(len(p.values) for p in self.params)

    def base_config(self, **changes: Any) -> TrainConfig:
        return TrainConfig(**{**self.train, **changes})


def load(path: str | Path, folder: str | Path | None = None) -> Spec:
    """Read and check a spec file; `folder` overrides its sweep folder."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (a sweep spec is TOML)") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}") from None
    return parse(raw, path, folder)


def parse(raw: dict[str, Any], path: Path, folder: str | Path | None = None) -> Spec:
    """Check every key of a spec's TOML; SpecError names the first problem."""
    where = str(path)
    for key, value in raw.items():
        if key in SECTIONS and SECTIONS[key] is not None and key != "":
            if not isinstance(value, dict):
                raise SpecError(f"{where}: [{key}] must be a table")
            unknown = sorted(set(value) - set(SECTIONS[key]))
            if unknown:
                raise SpecError(
                    f"{where}: [{key}]: unknown key {unknown[0]!r} "
                    f"(known: {', '.join(SECTIONS[key])})"
                )
        elif key in ("train", "search", "baseline"):
            if not isinstance(value, dict):
                raise SpecError(f"{where}: [{key}] must be a table")
        elif key not in SECTIONS[""]:
            raise SpecError(f"{where}: unknown key {key!r}")

    train = _train(raw.get("train", {}), where)
    params = _search(raw.get("search", {}), train, where)
    sampler = _choice(raw.get("sampler", "tpe"), SAMPLERS, "sampler", where)
    trials = _int(raw.get("trials", 0 if sampler == "grid" else 20), "trials", where, low=0)
    if sampler == "grid":
        ranged = [p.flag for p in params if p.kind != "values"]
        if ranged:
            raise SpecError(
                f"{where}: the grid sampler needs a list of values for every flag, "
                f'{ranged[0]} has a range (give values = [...], or sampler = "tpe")'
            )
        size = math.prod(len(p.values) for p in params)
        if trials > size:
            raise SpecError(f"{where}: trials = {trials}, but the grid has only {size} points")
        trials = trials or size
    elif trials < 1:
        raise SpecError(f"{where}: trials must be at least 1")

    budget, metric, prune = raw.get("budget", {}), raw.get("metric", {}), raw.get("prune", {})
    champion, fleet = raw.get("champion", {}), raw.get("fleet", {})
    if "tokens" not in budget:
        raise SpecError(f"{where}: [budget] needs tokens (the same token budget for every trial)")
    budget_tokens = _int(budget["tokens"], "budget.tokens", where, low=1)
    evals = _int(budget.get("evals", 8), "budget.evals", where, low=1)
    name = metric.get("name", "val_bpb")
    if name not in METRICS:
        known = ", ".join(f"{k} ({v})" for k, v in METRICS.items())
        raise SpecError(f"{where}: [metric] name {name!r} is not one a trial produces: {known}")
    if name == "val_bpb" and train.get("synthetic"):
        raise SpecError(
            f"{where}: [metric] val_bpb needs a dataset (bytes to count): a --synthetic trial "
            "produces val_loss only"
        )
    direction = _choice(
        metric.get("direction", "minimize"), ("minimize", "maximize"), "metric.direction", where
    )
    rule = _choice(prune.get("rule", "median"), RULES, "prune.rule", where)
    warmup = _float(prune.get("warmup", WARMUP), "prune.warmup", where)
    if not 0 <= warmup < 1:
        raise SpecError(f"{where}: prune.warmup is a fraction of the budget, [0, 1): {warmup}")
    diverge = _float(prune.get("diverge", 1.0), "prune.diverge", where)
    if diverge < 0:
        raise SpecError(f"{where}: prune.diverge must not be negative (0 = never)")
    seeds = champion.get("seeds", [1, 2])
    if not isinstance(seeds, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in seeds
    ):
        raise SpecError(f"{where}: champion.seeds must be a list of integers, got {seeds!r}")
    base_seed = int(train.get("seed", FIELDS["seed"].default))
    if base_seed in seeds or len(set(seeds)) != len(seeds):
        raise SpecError(
            f"{where}: champion.seeds {seeds} must be new seeds, each once (the trials' own "
            f"seed is {base_seed})"
        )
    sweep_name = str(raw.get("name") or path.stem)
    spec = Spec(
        path=path,
        name=sweep_name,
        folder=Path(folder or raw.get("folder") or Path("sweeps") / sweep_name),
        sampler=sampler,
        trials=trials,
        sampler_seed=_int(raw.get("sampler_seed", 0), "sampler_seed", where),
        startup_trials=_int(raw.get("startup_trials", 5), "startup_trials", where, low=0),
        train=train,
        params=params,
        baseline=_baseline(raw.get("baseline", {}), params, train, where),
        budget_tokens=budget_tokens,
        evals=evals,
        metric=name,
        direction=direction,
        rule=rule,
        warmup=warmup,
        diverge=diverge,
        min_trials=_int(prune.get("min_trials", 3), "prune.min_trials", where, low=1),
        reduction=_int(prune.get("reduction", 3), "prune.reduction", where, low=2),
        top_k=_int(champion.get("top_k", 3), "champion.top_k", where, low=1),
        seeds=tuple(seeds),
        fleet=_fleet(fleet, where),
        raw=raw,
    )
    try:  # the budget must hold an update per evaluation, the batch fit the fleet
        trial_plan(spec, {p.name: (p.values[0] if p.values else p.low) for p in params})
    except ConfigError as e:
        raise SpecError(f"{where}: {' '.join(str(e).split())}") from None
    return spec


# --- sections -------------------------------------------------------------------------------
def _name(key: str, section: str, where: str) -> str:
    name = key.replace("-", "_")
    if name not in FIELDS:
        raise SpecError(f"{where}: [{section}] --{key.replace('_', '-')} is not a fleet train flag")
    if name in OWNED:
        raise SpecError(
            f"{where}: [{section}] --{name.replace('_', '-')} is set by the sweep for each trial "
            "(the budget sets --updates and --eval-every; each trial has its own --run-dir)"
        )
    return name


def _train(table: dict[str, Any], where: str) -> dict[str, Any]:
    named = {_name(k, "train", where): v for k, v in table.items()}
    try:
        values = check_keys(named, f"{where}: [train]")
        TrainConfig(**values).validate()
    except ConfigError as e:
        raise SpecError(" ".join(str(e).split())) from None
    return values


def _search(table: dict[str, Any], train: dict[str, Any], where: str) -> tuple[Param, ...]:
    if not table:
        raise SpecError(f"{where}: the search space is empty: give at least one flag in [search]")
    params = []
    for key, entry in table.items():
        name = _name(key, "search", where)
        flag = "--" + name.replace("_", "-")
        if name in UNSEARCHABLE:
            raise SpecError(
                f"{where}: [search] {flag} cannot be searched"
                + (" (the champion's re-runs take [champion] seeds)" if name == "seed" else "")
            )
        if name in train:
            raise SpecError(f"{where}: {flag} is both fixed in [train] and searched in [search]")
        default = FIELDS[name].default
        if isinstance(entry, list):
            entry = {"values": entry}
        if not isinstance(entry, dict):
            raise SpecError(
                f"{where}: [search] {flag}: give {{ low = .., high = .. }} or {{ values = [..] }}"
            )
        unknown = sorted(set(entry) - {"low", "high", "log", "values"})
        if unknown:
            raise SpecError(f"{where}: [search] {flag}: unknown key {unknown[0]!r}")
        if "values" in entry:
            values = entry["values"]
            if not isinstance(values, list) or not values:
                raise SpecError(f"{where}: [search] {flag}: values must be a non-empty list")
            checked = [_value(name, v, train, where) for v in values]
            if len(set(map(repr, checked))) != len(checked):
                raise SpecError(f"{where}: [search] {flag}: a value is listed twice")
            params.append(Param(name, "values", values=tuple(checked)))
            continue
        if "low" not in entry or "high" not in entry:
            raise SpecError(f"{where}: [search] {flag}: a range needs low and high")
        if isinstance(default, (bool, str)):
            raise SpecError(
                f"{where}: [search] {flag} takes {type(default).__name__} values: give values"
            )
        low = _value(name, entry["low"], train, where)
        high = _value(name, entry["high"], train, where)
        log = entry.get("log", False)
        if not isinstance(log, bool):
            raise SpecError(f"{where}: [search] {flag}: log must be true or false")
        if not low < high:
            raise SpecError(f"{where}: [search] {flag}: low {low} must be below high {high}")
        if log and low <= 0:
            raise SpecError(f"{where}: [search] {flag}: a log range needs low > 0, got {low}")
        kind = "int" if isinstance(default, int) else "float"
        params.append(Param(name, kind, low=low, high=high, log=log))
    return tuple(params)


def _value(name: str, value: Any, train: dict[str, Any], where: str) -> Any:
    """One value of a searched flag, typed as the flag and checked as a whole config."""
    flag = "--" + name.replace("_", "-")
    try:
        typed = check_keys({name: value}, f"{where}: [search] {flag}")[name]
        TrainConfig(**{**train, name: typed}).validate()
    except ConfigError as e:
        raise SpecError(" ".join(str(e).split())) from None
    return typed


def _baseline(
    table: dict[str, Any], params: tuple[Param, ...], train: dict[str, Any], where: str
) -> dict[str, Any]:
    searched = {p.name: p for p in params}
    out = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in searched:
            raise SpecError(
                f"{where}: [baseline] --{name.replace('_', '-')} is not searched in [search]"
            )
        out[name] = _value(name, value, train, where)
        p = searched[name]
        if p.kind == "values" and out[name] not in p.values:
            raise SpecError(f"{where}: [baseline] {p.flag} {value!r} is not among its values")
        # A range may leave the baseline out (today's default, say): Optuna runs it anyway.
    missing = [p.flag for p in params if p.name not in out]
    if out and missing:
        raise SpecError(f"{where}: [baseline] needs every searched flag: {missing[0]} is missing")
    return out


def _fleet(table: dict[str, Any], where: str) -> Fleet:
    ranks = _int(table.get("ranks", 1), "fleet.ranks", where, low=1)
    hostfile = str(table.get("hostfile", ""))
    concurrent = _int(table.get("concurrent", 1), "fleet.concurrent", where, low=1)
    env = table.get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, str) and "=" in e for e in env):
        raise SpecError(f"{where}: fleet.env must be a list of KEY=VALUE strings")
    if hostfile and "ranks" in table:
        raise SpecError(f"{where}: [fleet] give ranks (this machine) or hostfile, not both")
    return Fleet(
        ranks=ranks,
        hostfile=hostfile,
        backend=str(table.get("backend", "")),
        starting_port=_int(table.get("starting_port", 0), "fleet.starting_port", where, low=0),
        env=tuple(env),
        concurrent=concurrent,
        stop_grace=_float(table.get("stop_grace", 30.0), "fleet.stop_grace", where),
        restarts=_int(table.get("restarts", 0), "fleet.restarts", where, low=0),
    )


# --- scalars --------------------------------------------------------------------------------
def _int(value: Any, key: str, where: str, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}: {key} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise SpecError(f"{where}: {key} must be at least {low}, got {value}")
    return value


def _float(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"{where}: {key} must be a finite number, got {value!r}")
    return float(value)


def _choice(value: Any, choices: tuple[str, ...], key: str, where: str) -> str:
    if value not in choices:
        raise SpecError(f"{where}: {key} must be one of {', '.join(choices)}, got {value!r}")
    return value
