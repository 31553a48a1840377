"""AdamW against Muon (issue 13's figure): validation loss at equal tokens, and time per update.

    python benchmarks/optimizers.py --updates 300 --out /tmp/optimizers.json

Both train the same model with the same schedule and data order on the standard-library
corpus (byte tokenizer); each optimizer at its usual peak rate (AdamW --lr 2e-3, Muon
--muon-lr 0.02 with AdamW at --lr for the embedding and head). `--repeats` runs each
optimizer that many times, interleaved, for the spread of the update time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from telemetry.arrowlog import read_events, read_updates  # noqa: E402
from tests.support.fleet import run_fleet  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--local-batch", type=int, default=16)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-opt-"))
    data = tmp / "data"
    run_fleet("prepare", "--stdlib", "--seq-len", str(args.seq_len), "--out", str(data))
    rows = []
    for rep in range(args.repeats):
        for opt in ("adamw", "muon"):
            run = tmp / f"{opt}-{rep}"
            run_fleet(
                *("train", "--data", str(data), "--run-dir", str(run), "--optimizer", opt),
                *("--depth", str(args.depth), "--width", str(args.width), "--heads", "2"),
                *("--local-batch", str(args.local_batch), "--updates", str(args.updates + 1)),
                *("--eval-every", str(args.updates), "--eval-samples", "0"),
                *("--telemetry-port-base", "0", "--log-every", "50"),
                timeout=3600,
            )
            (val,) = [e.data["val_loss"] for e in read_events(run, 0) if e.kind == "eval"]
            upd = read_updates(run, 0).to_pylist()[5:]  # past compilation
            times = [u["update_s"] for u in upd]
            rows.append(
                {
                    "optimizer": opt,
                    "repeat": rep,
                    "val_loss": val,
                    "tokens": upd[args.updates - 6]["tokens"],
                    "median_update_ms": 1e3 * statistics.median(times),
                }
            )
            print(rows[-1], flush=True)
    summary = {}
    for opt in ("adamw", "muon"):
        mine = [r for r in rows if r["optimizer"] == opt]
        summary[opt] = {
            "val_loss": [round(r["val_loss"], 4) for r in mine],
            "median_update_ms": [round(r["median_update_ms"], 1) for r in mine],
        }
    out = {"config": vars(args), "runs": rows, "summary": summary}
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
