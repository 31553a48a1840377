"""`fleet report SWEEP` and `fleet sweep promote SWEEP`: every trial side by side (its values,
metric, tokens/s, wall time, peak memory and why it ended), the champion marked with its
spread over seeds, the plots (`--plot FILE`), and the champion's command line."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telemetry.units import GiB, MiB, gib_text
from trainer.sweep import champion, layout, plan, pruning
from trainer.sweep.controller import SweepError, need_optuna, records
from trainer.sweep.spec import Spec, SpecError, load


@dataclass
class Sweep:
    """A sweep folder, read (never written: the controller may be running)."""

    folder: Path
    spec: Spec
    trials: list[Any]  # Optuna FrozenTrials
    records: list[champion.Record]


def open_sweep(folder: str | Path) -> Sweep:
    folder = Path(folder)
    d = layout.at(folder)
    if not layout.is_sweep(folder):
        raise SweepError(f"{folder} is not a sweep folder (no {layout.SPEC} and {layout.STUDY})")
    try:
        spec = load(d.spec, folder)
    except SpecError as e:
        raise SweepError(str(e)) from None
    optuna = need_optuna()
    storage = optuna.storages.RDBStorage(d.storage_url, skip_table_creation=True)
    study = optuna.load_study(study_name="sweep", storage=storage)
    return Sweep(folder, spec, study.get_trials(deepcopy=False), records(study))


def ended(t: Any) -> str:
    """Why a trial ended, in words (with the pruner's figures)."""
    a, state = t.user_attrs, t.state.name
    if state == "COMPLETE":
        return "finished"
    if state == "PRUNED":
        return f"pruned: {a.get('pruned', 'by the pruner')}"
    if state == "FAIL":
        return f"failed: {a.get('failed', 'unknown')}"
    if a.get("pruned"):
        return f"being pruned: {a['pruned']}"
    return state.lower()


def rows(s: Sweep) -> list[dict[str, Any]]:
    """One row per trial, in trial order."""
    best, final = champion.crown(s.records, s.spec.top_k, s.spec.seeds, s.spec.minimize)
    out = []
    for t in s.trials:
        a = t.user_attrs
        value = t.value if t.state.name == "COMPLETE" else None
        last = max(t.intermediate_values, default=None)
        out.append(
            {
                "trial": t.number,
                "role": a.get("role", champion.SEARCH),
                "of": a.get("of"),
                "seed": a.get("seed"),
                "params": dict(t.params),
                "state": t.state.name,
                "metric": value,
                "last_metric": t.intermediate_values[last] if last is not None else None,
                "last_at": (last / pruning.STEPS) if last is not None else None,
                "tokens_per_s": a.get("tokens_per_s"),
                "run_s": a.get("run_s"),
                "peak_mem": a.get("peak_mem"),
                "ended": ended(t),
                "champion": best is not None and best.number == t.number,
                "curve": {k / pruning.STEPS: v for k, v in sorted(t.intermediate_values.items())},
            }
        )
    return out


def summary(s: Sweep) -> dict[str, Any]:
    spec = s.spec
    cands = champion.candidates(s.records, spec.top_k, spec.seeds, spec.minimize)
    best, final = champion.crown(s.records, spec.top_k, spec.seeds, spec.minimize)
    return {
        "sweep": str(s.folder),
        "name": spec.name,
        "metric": spec.metric,
        "direction": spec.direction,
        "sampler": spec.sampler,
        "rule": spec.rule,
        "trials": rows(s),
        "candidates": [
            {
                "trial": c.number,
                "params": c.params,
                "seeds": list(c.seeds),
                "values": list(c.values),
                "mean": c.mean,
                "min": c.spread[0],
                "max": c.spread[1],
                "sd": c.spread[2],
                "missing": list(c.missing),
            }
            for c in cands
        ],
        "champion": best.number if best is not None else None,
        "final": final,
    }


def _num(v: Any, fmt: str = ".4f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, fmt) if isinstance(v, (int, float)) else str(v)


def _size(n: int | None) -> str:
    """Peak memory: GiB, or MiB for the tiny models of a CPU sweep."""
    if not n:
        return "-"
    return gib_text(n) if n >= GiB else f"{n / MiB:.0f} MiB"


def _params(params: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


def render(data: dict[str, Any]) -> str:
    """The report as text: the trials' table, why each ended, the champion."""
    metric = data["metric"]
    lines = [
        f"sweep {data['name']} ({data['sweep']}): {data['sampler']} sampler, "
        f"{data['rule']} pruning, {metric} ({data['direction']})",
        "",
        f"  {'trial':>5}  {'role':<10} {'seed':>4}  {'values':<36} {metric:>9}  "
        f"{'tok/s':>8}  {'wall':>6}  {'peak':>9}  ended",
    ]
    for r in data["trials"]:
        role = f"re-run {r['of']}" if r["role"] == champion.CONFIRM else "search"
        shown = r["metric"] if r["metric"] is not None else r["last_metric"]
        value = _num(shown) + ("" if r["metric"] is not None or shown is None else "~")
        mark = "*" if r["champion"] else " "
        lines.append(
            f"{mark} {r['trial']:>5}  {role:<10} {_num(r['seed'], 'd'):>4}  "
            f"{_params(r['params'])[:36]:<36} {value:>9}  {_num(r['tokens_per_s'], ',.0f'):>8}  "
            f"{_num(r['run_s'], '.0f'):>5}s  "
            f"{_size(r['peak_mem']):>9}  {r['ended']}"
        )
    lines.append(
        "  (~: the last evaluation of a trial that did not finish; * the champion; "
        "wall: seconds its runs took)"
    )
    if data["candidates"]:
        lines += ["", f"the top {len(data['candidates'])} re-run on new seeds (best mean first):"]
        for c in data["candidates"]:
            mark = "*" if c["trial"] == data["champion"] else " "
            left = f"; seeds {c['missing']} not finished" if c["missing"] else ""
            lines.append(
                f"{mark} trial {c['trial']}: {metric} mean {_num(c['mean'])} over seeds "
                f"{c['seeds']} (min {_num(c['min'])}, max {_num(c['max'])}, sd {_num(c['sd'])})"
                f"{left}  {_params(c['params'])}"
            )
        if data["champion"] is not None:
            how = "champion" if data["final"] else "champion so far (re-runs still to finish)"
            lines.append(f"{how}: trial {data['champion']}")
    return "\n".join(lines)


def plot(data: dict[str, Any], spec: Spec, path: str) -> None:
    """Metric against each searched flag, and every trial's curve over the budget."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SweepError("--plot needs matplotlib: pip install 'mlx-fleet[plot]'") from None
    params = list(spec.params)
    fig, axes = plt.subplots(1, len(params) + 1, figsize=(4.5 * (len(params) + 1), 4))
    axes = list(axes) if len(params) else [axes]
    metric = data["metric"]
    for ax, p in zip(axes, params, strict=False):
        for r in data["trials"]:
            if r["role"] != champion.SEARCH or p.name not in r["params"]:
                continue
            y = r["metric"] if r["metric"] is not None else r["last_metric"]
            if y is None or not math.isfinite(y):
                continue
            x = r["params"][p.name]
            style = {"marker": "*", "s": 160} if r["champion"] else {"marker": "o", "s": 30}
            pruned = r["state"] != "COMPLETE"
            ax.scatter([x], [y], c="tab:gray" if pruned else "tab:blue", **style)
        if p.log:
            ax.set_xscale("log")
        ax.set_xlabel(p.flag)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} by {p.flag} (gray: pruned, at its last evaluation)", fontsize=8)
    curves = axes[-1]
    for r in data["trials"]:
        xs = list(r["curve"])
        if not xs:
            continue
        ys = [r["curve"][x] for x in xs]
        kind = ".-" if r["state"] == "COMPLETE" else ".:"
        curves.plot(xs, ys, kind, linewidth=2.5 if r["champion"] else 1, label=f"{r['trial']}")
    curves.set_xlabel("fraction of the budget")
    curves.set_ylabel(metric)
    curves.set_title("every trial (dotted: pruned or failed)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def promote(s: Sweep, updates: int, run_dir: str) -> str:
    """The command line of a full run with the champion's values."""
    spec = s.spec
    best, final = champion.crown(s.records, spec.top_k, spec.seeds, spec.minimize)
    if best is None:
        raise SweepError(f"{s.folder}: no trial has finished yet: there is no champion")
    trial = next(t for t in s.trials if t.number == best.number)
    argv = plan.promoted(
        spec,
        best.params,
        int(trial.user_attrs.get("seed", spec.seed)),
        updates or int(trial.user_attrs.get("updates", 0)),  # default: the trials' budget
        run_dir or f"runs/{spec.name}-champion",
    )
    note = "" if final else "  # champion so far: its re-runs have not all finished\n"
    low, high, sd = best.spread
    return (
        f"# trial {best.number}: {spec.metric} {best.mean:.4f} mean over {len(best.values)} "
        f"seed(s) (min {low:.4f}, max {high:.4f}, sd {sd:.4f})\n{note}{shlex.join(argv)}"
    )


def as_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, default=str)
