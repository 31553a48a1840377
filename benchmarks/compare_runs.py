"""Do two runs' checkpoints at one step hold the same update? (e.g. 2 GPUs on split 10,6 against
1 GPU on the whole batch of 16.)

    python benchmarks/compare_runs.py RUN_A RUN_B [--step 1] [--grad-rtol 0.05] [--json]

After one AdamW step the optimizer's first moment is (1 - beta1) x the clipped global
gradient, so comparing first moments compares the gradients the two runs applied. That is the
sharp test: the weights after step 1 are w0 - lr * g / (|g| + eps), about lr * sign(g), so an
element whose gradient is near zero can move either way within bf16 rounding; the weights are
therefore checked against a bound of one step (2 lr) and the share of such elements reported.
Exit status 0 when both hold.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np


def load(run: Path, step: int) -> tuple[dict, dict, dict]:
    folder = run / "checkpoints" / f"step-{step:06d}"
    if not folder.is_dir():
        sys.exit(f"compare_runs: {folder}: no such checkpoint")
    arrays = {}
    for name in ("weights", "optimizer"):
        tensors = mx.load(str(folder / f"{name}.safetensors"))
        arrays[name] = {k: np.array(v.astype(mx.float32)) for k, v in tensors.items()}
    state = json.loads((folder / "state.json").read_text())
    return arrays["weights"], arrays["optimizer"], state


def compare(a: Path, b: Path, step: int, grad_rtol: float) -> dict:
    wa, oa, sa = load(a, step)
    wb, ob, sb = load(b, step)
    if wa.keys() != wb.keys():
        sys.exit("compare_runs: the runs have different weights (not the same model)")
    lr = sa["lr"]
    moments = sorted(k for k in oa if k.endswith(".m"))
    diff2 = sum(float(np.sum((oa[k] - ob[k]) ** 2)) for k in moments)
    norm2 = sum(float(np.sum(oa[k] ** 2)) for k in moments)
    per_tensor = {
        k: float(np.linalg.norm(oa[k] - ob[k]) / max(np.linalg.norm(oa[k]), 1e-30)) for k in moments
    }
    worst = max(per_tensor, key=per_tensor.get)
    max_w = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
    n = sum(v.size for v in wa.values())
    flipped = sum(int(np.sum(np.abs(wa[k] - wb[k]) > lr)) for k in wa)
    out = {
        "runs": [str(a), str(b)],
        "splits": [sa["split"], sb["split"]],
        "step": step,
        "lr": lr,
        "grad_rel_err": (diff2 / norm2) ** 0.5 if norm2 else 0.0,
        "grad_rel_err_worst_tensor": [worst, per_tensor[worst]],
        "grad_rtol": grad_rtol,
        "weights_max_abs_diff": max_w,
        "weights_bound": 2 * lr,
        "weights_opposite_step_share": flipped / n,
        "same_samples": sa["tokens"] == sb["tokens"] and sa["cursor"] == sb["cursor"],
    }
    out["ok"] = bool(
        out["grad_rel_err"] <= grad_rtol
        and max_w <= 2 * lr * (1 + 1e-3) + 1e-7
        and out["same_samples"]
    )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("--step", type=int, default=1)
    p.add_argument("--grad-rtol", type=float, default=0.05, help="bf16: a few parts in 100")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    r = compare(args.run_a, args.run_b, args.step, args.grad_rtol)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        worst, worst_err = r["grad_rel_err_worst_tensor"]
        print(
            f"splits {r['splits'][0]} vs {r['splits'][1]} at step {r['step']}: gradient "
            f"relative error {r['grad_rel_err']:.2e} (worst tensor {worst} {worst_err:.2e}; "
            f"tolerance {r['grad_rtol']:g}); weights max |diff| {r['weights_max_abs_diff']:.2e} "
            f"(bound 2 lr = {r['weights_bound']:.2e}), {r['weights_opposite_step_share']:.3%} "
            "of elements stepped apart: " + ("SAME UPDATE" if r["ok"] else "DIFFERENT")
        )
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
