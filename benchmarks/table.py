"""Print the GPU comparison table from results.jsonl (one JSON object per benchmark run)."""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        print("no results")
        return 1
    ref = next((r for r in rows if r["label"] == "torch-compile"), None)
    print(
        f"{'run':<16}{'tokens/s':>12}{'MFU':>8}{'update ms':>11}{'peak GiB':>10}"
        f"{'params M':>10}{'vs compile':>12}"
    )
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        peak = f"{r['peak_bytes'] / 2**30:.1f}" if r.get("peak_bytes") else "-"
        rel = f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x" if ref else "-"
        print(
            f"{r['label']:<16}{r['tokens_per_s']:>12,.0f}{mfu:>8}{r['update_s'] * 1000:>11.1f}"
            f"{peak:>10}{r['params'] / 1e6:>10.1f}{rel:>12}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
