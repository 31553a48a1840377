"""The figures of benchmarks/two_gpu.sh in one table (Markdown, for RESULTS.md).

python benchmarks/two_gpu_table.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read(path: Path) -> dict | None:
    """A JSON file, or the last line of one that holds JSON lines; None if absent or broken."""
    try:
        text = path.read_text().strip()
        return json.loads(text) if text.startswith("{\n") else json.loads(text.splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def ms(seconds: list[float] | float) -> str:
    values = seconds if isinstance(seconds, list) else [seconds]
    return " ".join(f"{1000 * s:.1f}" for s in values) + " ms"


def same_update(d: dict) -> tuple[str, str]:
    verdict = "PASS" if d["ok"] else "FAIL"
    return (
        f"same update, split {d['splits'][1]} vs {d['splits'][0]}",
        f"gradient rel. error {d['grad_rel_err']:.2e} (tolerance {d['grad_rtol']:g}); weights max"
        f" diff {d['weights_max_abs_diff']:.1e} (2 lr = {d['weights_bound']:.1e}); "
        f"{d['weights_opposite_step_share']:.4%} stepped apart: {verdict}",
    )


def console_ranks(d: dict) -> tuple[str, str]:
    cells = []
    for r in d.get("ranks", []):
        u = r.get("update") or {}
        phases = [u.get(k, 0.0) for k in ("compute_s", "wait_s", "transfer_s", "optimizer_s")]
        cells.append(f"rank {r.get('rank')} (batch {u.get('local_batch')}): {ms(phases)}")
    return "console --once: compute / wait / transfer / optimizer", "; ".join(cells)


def balance_rows(d: dict, label: str) -> list[tuple[str, str]]:
    rows = []
    for v in d["variants"]:
        ar = v.get("allreduce", {})
        rows.append(
            (
                f"{label}: split {v['split']}",
                f"{v['tokens_per_s']:,.0f} tok/s; update {ms(v['update_s'])}; compute "
                f"{ms(v['compute_s'])}; transfer {ms(v['transfer_s'])}; optimizer "
                f"{ms(v.get('optimizer_s', []))}; all-reduce {ar.get('busbw_GBps', 0):.0f} GB/s",
            )
        )
    s = d.get("scaling")
    if s:
        rows.append(
            (
                f"{label}: scaling 1 -> {s['ranks']}",
                f"{s['one_rank_tokens_per_s']:,.0f} -> {s['ranks_tokens_per_s']:,.0f} tok/s = "
                f"{s['speedup']:.3f}x ({s['efficiency']:.1%}); one rank: update "
                f"{ms(s['one_rank_update_s'])}, compute {ms(s.get('one_rank_compute_s', 0))}, "
                f"optimizer {ms(s.get('one_rank_optimizer_s', 0))}",
            )
        )
    return rows


def allreduce_row(d: dict) -> tuple[str, str]:
    label = "NCCL via PyTorch" if d["framework"] == "torch" else "MLX all_sum"
    parts = [
        f"{k}: {v['busbw_GBps']:.0f} GB/s bus ({ms(v['time_s'])})"
        for k, v in d.items()
        if isinstance(v, dict)
    ]
    return f"{label}, {d['bytes'] / 1e6:.0f} MB", "; ".join(parts)


def main() -> int:
    out = Path(sys.argv[1])
    rows: list[tuple[str, str]] = []
    if d := read(out / "same-update.json"):
        rows.append(same_update(d))
    if d := read(out / "console.json"):
        rows.append(console_ranks(d))
    for name, label in (("balance.json", "balance"), ("balance-32.json", "32 MiB buckets")):
        if d := read(out / name):
            rows += balance_rows(d, label)
    for fw in ("mlx", "torch"):
        if d := read(out / f"allreduce-{fw}.json"):
            rows.append(allreduce_row(d))
    for name in sorted(out.glob("throughput-*.json")):
        if d := read(name):
            rows.append(
                (
                    f"1 GPU bench throughput, {name.stem.removeprefix('throughput-')}",
                    f"{d['tokens_per_s']:,.0f} tok/s; update {ms(d['update_s'])}; microsteps "
                    f"{ms(d['microsteps_s'])}; optimizer {ms(d['optimizer_s'])}; peak "
                    f"{d['peak_bytes'] / 1024**3:.1f} GiB",
                )
            )
    print("| measurement | result |\n| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
