"""gpu_memory.sh's bookkeeping: one JSON line per step, then issue 20's summary in one JSON.

    python benchmarks/memory_report.py step LABEL RC SECONDS STDOUT STDERR   # one JSON line
    python benchmarks/memory_report.py report STEPS.jsonl OUT.json [--elapsed S] [--config C]

The summary reads the steps by label: `ours-<precision>` (the default: --memory-limit-gb
auto), `lm-bf16` (mlx-lm's trainer, no limit), `lm-bf16-tight` (its live set), `lm-bf16-same`
(under our bf16 run's limit), `pair-<n>-default` / `pair-<n>-unlimited` (interleaved),
`slope-<side>-b<batch>`, `ours-bf16-plain-head`, `heads` (benchmarks/loss_heads.py). What it
states: default peak over live set, speed against unlimited (per pair and median), our live
sets against mlx-lm's, the peak's slope per sample, and the fused head's speed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from telemetry.units import GiB

DROP = ("update_s_all", "tokens_per_s_all")  # long lists: the medians are kept


def _last_object(text: str) -> dict | None:
    for chunk in (text, *reversed(text.strip().splitlines())):
        try:
            value = json.loads(chunk)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def step_line(label: str, rc: int, seconds: int, out: Path, err: Path) -> dict:
    """One step's record: its figures (the JSON it printed) or the tail of its errors."""
    text = out.read_text(errors="replace") if out.exists() else ""
    result = _last_object(text)
    rec: dict = {"label": label, "rc": rc, "seconds": seconds, "ok": rc == 0 and bool(result)}
    if result:
        rec["result"] = {k: v for k, v in result.items() if k not in DROP}
    if not rec["ok"] and err.exists():
        rec["error"] = err.read_text(errors="replace").strip().splitlines()[-6:]
    return rec


def _gib(n) -> float | None:
    return n / GiB if n else None


def summary(steps: dict[str, dict]) -> dict:
    """Issue 20's figures from the steps that ran."""

    def ok(label: str) -> dict | None:
        s = steps.get(label)
        return s["result"] if s and s.get("ok") else None

    out: dict = {"runs": {}}
    for label in steps:
        r = ok(label)
        if r and "peak_bytes" in r:
            out["runs"][label] = {
                "tokens_per_s": r.get("tokens_per_s"),
                "peak_gib": _gib(r.get("peak_bytes")),
                "live_set_gib": _gib(r.get("live_set_bytes")),
                "peak_over_live": r.get("peak_over_live"),
                "memory_limit": r.get("memory_limit"),
                "memory_limit_gib": _gib(r.get("memory_limit_bytes")),
            }
    # default peak against the live set, at the speed of no limit (three interleaved pairs)
    pairs = []
    for n in sorted({m[1] for k in steps if (m := re.match(r"pair-(\d+)-", k))}):
        d, u = ok(f"pair-{n}-default"), ok(f"pair-{n}-unlimited")
        if d and u:
            pairs.append(
                {
                    "speed_default_over_unlimited": d["tokens_per_s"] / u["tokens_per_s"],
                    "peak_default_gib": _gib(d["peak_bytes"]),
                    "peak_unlimited_gib": _gib(u["peak_bytes"]),
                    "live_set_gib": _gib(d.get("live_set_bytes")),
                    "default_peak_over_live": d.get("peak_over_live"),
                }
            )
    if pairs:
        speeds = [p["speed_default_over_unlimited"] for p in pairs]
        ratios = [p["default_peak_over_live"] for p in pairs if p["default_peak_over_live"]]
        out["default_vs_unlimited"] = {
            "pairs": pairs,
            "speed_median": statistics.median(speeds),
            "speed_range": [min(speeds), max(speeds)],
            "peak_over_live_max": max(ratios) if ratios else None,
            "goal": "default peak <= 1.1x the live set at >= 0.98x the unlimited speed",
            "met": bool(ratios) and max(ratios) <= 1.1 and statistics.median(speeds) >= 0.98,
        }
    # live sets against mlx-lm's (bf16: at most 1.0x, aim 0.8x; mixed: at most 1.1x)
    lm_live = ok("lm-bf16-tight")
    if lm_live:
        against = {}
        for precision, bar in (("bf16", 1.0), ("mixed", 1.1)):
            ours = ok(f"ours-{precision}")
            if ours and ours.get("live_set_bytes"):
                ratio = ours["live_set_bytes"] / lm_live["peak_bytes"]
                against[precision] = {"ratio": ratio, "goal": bar, "met": ratio <= bar}
        out["live_set_vs_mlx_lm_bf16"] = against
    # the slope of the peak per sample (and of the live set, ours)
    slopes = {}
    for side, full in (("ours", "ours-mixed"), ("lm", "lm-bf16")):
        points = {}
        for label in steps:
            if (m := re.fullmatch(rf"slope-{side}-b(\d+)", label)) and (r := ok(label)):
                points[int(m[1])] = r
        if (r := ok(full)) and (
            b := r.get("local_batch") or r.get("config", {}).get("local_batch")
        ):
            points.setdefault(int(b), r)
        if len(points) >= 2:
            batches = sorted(points)
            lo, hi = points[batches[0]], points[batches[-1]]
            span = batches[-1] - batches[0]
            slopes[side] = {
                "batches": batches,
                "peak_gib": [_gib(points[b]["peak_bytes"]) for b in batches],
                "peak_gib_per_sample": (hi["peak_bytes"] - lo["peak_bytes"]) / span / GiB,
            }
            if all(points[b].get("live_set_bytes") for b in batches):
                slopes[side]["live_gib"] = [_gib(points[b]["live_set_bytes"]) for b in batches]
                slopes[side]["live_gib_per_sample"] = (
                    (hi["live_set_bytes"] - lo["live_set_bytes"]) / span / GiB
                )
    out["per_sample"] = slopes
    heads = ok("heads")
    if heads:
        out["loss_heads"] = [
            {
                "vocab": r["vocab"],
                **{
                    name: {
                        "ms": f["ms_median"],
                        "x_plain": f["time_over_plain"],
                        "live_gib": _gib(f["live"]),
                    }
                    for name, f in r["variants"].items()
                },
            }
            for r in heads["results"]
        ]
    fused, plain = ok("ours-bf16"), ok("ours-bf16-plain-head")
    if fused and plain:
        out["fused_head_update_speed_over_plain"] = fused["tokens_per_s"] / plain["tokens_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("step")
    st.add_argument("label")
    st.add_argument("rc", type=int)
    st.add_argument("seconds", type=int)
    st.add_argument("stdout", type=Path)
    st.add_argument("stderr", type=Path)
    rp = sub.add_parser("report")
    rp.add_argument("steps", type=Path)
    rp.add_argument("out", type=Path)
    rp.add_argument("--elapsed", type=int, default=0)
    rp.add_argument("--config", default="")
    rp.add_argument("--machine", type=Path, default=None)
    a = p.parse_args(argv)
    if a.cmd == "step":
        print(json.dumps(step_line(a.label, a.rc, a.seconds, a.stdout, a.stderr)))
        return 0
    steps = {}
    for line in a.steps.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            steps[rec["label"]] = rec
    machine = a.machine.read_text().splitlines() if a.machine and a.machine.exists() else []
    report = {
        "issue": 20,
        "config": a.config,
        "elapsed_s": a.elapsed,
        "machine": machine,
        "summary": summary(steps),
        "steps": steps,
    }
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    json.dump(report["summary"], sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
