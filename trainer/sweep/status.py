"""`fleet sweep status SWEEP`: trials done, pruned, failed and running, the champion so far,
and the time left, read from the study and the trials' run folders (the controller may be
running: nothing here writes)."""

from __future__ import annotations

import statistics
from typing import Any

from trainer.progress import duration
from trainer.sweep import champion, layout, metric
from trainer.sweep.report import Sweep


def status(s: Sweep) -> dict[str, Any]:
    spec, trials = s.spec, s.trials
    states = [t.state.name for t in trials]
    search = [t for t in trials if t.user_attrs.get("role", champion.SEARCH) == champion.SEARCH]
    reruns = [t for t in trials if t.user_attrs.get("role") == champion.CONFIRM]
    running = []
    for t in trials:
        if t.state.name != "RUNNING":
            continue
        updates = int(t.user_attrs.get("updates", 0))
        step = metric.progress(layout.at(s.folder).trial(t.number)).step
        last = max(t.intermediate_values, default=None)
        running.append(
            {
                "trial": t.number,
                "step": step,
                "updates": updates,
                "fraction": min(1.0, step / updates) if updates else 0.0,
                "metric": t.intermediate_values[last] if last is not None else None,
            }
        )
    best, final = champion.crown(s.records, spec.top_k, spec.seeds, spec.minimize)
    # Time left: the mean wall time of the finished trials, for what is still to run.
    took = [float(t.user_attrs["run_s"]) for t in trials if t.state.name == "COMPLETE"
            and "run_s" in t.user_attrs]  # fmt: skip
    mean_s = statistics.fmean(took) if took else None
    to_start = max(0, spec.trials - sum(1 for t in search if t.state.name != "WAITING"))
    done_search = all(t.state.name not in ("RUNNING", "WAITING") for t in search)
    if done_search and to_start == 0:
        reruns_left = len(champion.reruns_needed(s.records, spec.top_k, spec.seeds, spec.minimize))
    else:
        reruns_left = spec.top_k * len(spec.seeds)
    reruns_left += sum(1 for t in reruns if t.state.name == "WAITING")
    left = None
    if mean_s is not None:
        work = to_start + reruns_left + sum(1 - r["fraction"] for r in running)
        left = work * mean_s / spec.fleet.concurrent
    alive = layout.controller_alive(s.folder)
    return {
        "sweep": str(s.folder),
        "name": spec.name,
        "metric": spec.metric,
        "controller": alive,
        "done": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "failed": states.count("FAIL"),
        "running": running,
        "search_started": spec.trials - to_start,
        "search_trials": spec.trials,
        "reruns_done": sum(1 for t in reruns if t.state.name not in ("RUNNING", "WAITING")),
        "reruns_planned": spec.top_k * len(spec.seeds),
        "champion": None
        if best is None
        else {
            "trial": best.number,
            "mean": best.mean,
            "seeds": list(best.seeds),
            "min": best.spread[0],
            "max": best.spread[1],
            "final": final,
            "params": best.params,
        },
        "left_s": left,
        "mean_trial_s": mean_s,
    }


def render(st: dict[str, Any]) -> str:
    m = st["metric"]
    alive = st["controller"]
    lines = [
        f"sweep {st['name']} ({st['sweep']}): "
        + (
            f"controller running (pid {alive['pid']})"
            if alive
            else f"no controller running (`fleet sweep {st['sweep']} --resume` goes on)"
        ),
        f"  trials: {st['done']} done, {st['pruned']} pruned, {st['failed']} failed, "
        f"{len(st['running'])} running; search {st['search_started']}/{st['search_trials']} "
        f"started, re-runs on new seeds {st['reruns_done']}/{st['reruns_planned']}",
    ]
    for r in st["running"]:
        shown = f", {m} {r['metric']:.4f} at its last evaluation" if r["metric"] is not None else ""
        lines.append(
            f"  running: trial {r['trial']} at update {r['step']}/{r['updates']} "
            f"({r['fraction']:.0%}){shown}"
        )
    c = st["champion"]
    if c is None:
        lines.append("  champion so far: none (no trial has finished)")
    else:
        spread = (
            f" over seeds {c['seeds']} (min {c['min']:.4f}, max {c['max']:.4f})"
            if len(c["seeds"]) > 1
            else " (one seed so far)"
        )
        how = "champion" if c["final"] else "champion so far"
        lines.append(f"  {how}: trial {c['trial']}, {m} {c['mean']:.4f}{spread}")
    if st["left_s"] is not None:
        lines.append(
            f"  time left: about {duration(st['left_s'])} (a finished trial took "
            f"{st['mean_trial_s']:.0f} s on average)"
        )
    else:
        lines.append("  time left: unknown until a trial finishes")
    return "\n".join(lines)
