"""Issue 12's memory levers, each against its absence, in one process and interleaved: the peak
active memory and the median time of one microstep (forward, backward, FP32 accumulation).

    python benchmarks/mlx_levers.py --depth 12 --width 768 --heads 12 --vocab 32768 \
        --seq-len 1024 --local-batch 16 --precision mixed --loss-chunk 4096 --json

Variants, each a Stepper of its own over the same model and batch (so each has its own
compiled graph), measured round-robin --reps times:
  product          the trainer as it is on this device: what each lever is compared with
  relu2-recompute  the MLP's ReLU² recomputed from z in the backward pass (trainer/step.py
                   relu2_proj; the product's choice on a GPU)
  relu2-plain      ReLU² under plain autodiff, keeping ReLU(z) and its square (the CPU's)
  zeros-first      the first microstep adding its gradients to FP32 zeros, as before, instead
                   of its gradients becoming the accumulators
  loss-chunk       the head in --loss-chunk rows a chunk, gradients computed with the loss
  grad-checkpoint  every block recomputed in the backward pass (--grad-checkpoint)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx

from bench.update import synthetic_stepper
from trainer.data.dataset import SyntheticStream
from trainer.step import Stepper, zeros_f32


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (
        ("depth", 12),
        ("width", 768),
        ("heads", 12),
        ("vocab", 32768),
        ("seq-len", 1024),
        ("local-batch", 16),
        ("loss-chunk", 4096),
        ("reps", 5),
    ):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--precision", default="mixed", choices=("fp32", "bf16", "mixed"))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    model, opt, product = synthetic_stepper(
        depth=a.depth,
        width=a.width,
        heads=a.heads,
        vocab=a.vocab,
        seq_len=a.seq_len,
        precision=a.precision,
    )
    batch = mx.array(
        SyntheticStream(a.vocab, a.seq_len, 0).batch(0, a.local_batch, 0, a.local_batch)
    )
    mx.eval(batch)

    def stepper(**kw) -> Stepper:
        return Stepper(model, opt, precision=a.precision, pad_id=-1, grad_clip=1.0, **kw)

    chunked, ckpt = stepper(loss_chunk=a.loss_chunk), stepper(grad_checkpoint=True)
    recompute, plain = stepper(relu2_recompute=True), stepper(relu2_recompute=False)

    def first(s: Stepper):
        return lambda: s.microstep(None, None, None, batch)

    def zeros_first():
        zero = mx.array(0.0)
        return product.microstep(zeros_f32(model.trainable_parameters()), zero, zero, batch)

    variants = {
        "product": first(product),
        "relu2-recompute": first(recompute),
        "relu2-plain": first(plain),
        "zeros-first": zeros_first,
        "loss-chunk": first(chunked),
        "grad-checkpoint": first(ckpt),
    }
    figures: dict[str, dict[str, list]] = {k: {"peak": [], "ms": []} for k in variants}
    for rep in range(a.reps + 1):  # the first round compiles and is not counted
        for name, fn in variants.items():
            mx.synchronize()
            mx.reset_peak_memory()
            before = mx.get_active_memory()
            t0 = time.perf_counter()
            out = fn()
            mx.eval(out)
            ms = 1000 * (time.perf_counter() - t0)
            peak = max(mx.get_peak_memory(), before)
            del out
            if rep:
                figures[name]["peak"].append(peak)
                figures[name]["ms"].append(ms)
    base = figures["product"]
    base_ms, base_peak = statistics.median(base["ms"]), max(base["peak"])
    result = {}
    for name, f in figures.items():
        ms, peak = statistics.median(f["ms"]), max(f["peak"])
        result[name] = {
            "peak_bytes": peak,
            "ms_median": ms,
            "ms_all": f["ms"],
            "peak_minus_product_bytes": peak - base_peak,
            "time_over_product": ms / base_ms,
        }
    out = {
        "config": vars(a),
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "variants": result,
    }
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for name, r in result.items():
        print(
            f"{name:<16} peak {r['peak_bytes'] / 2**30:7.3f} GiB "
            f"({r['peak_minus_product_bytes'] / 2**20:+9.1f} MiB)  microstep "
            f"{r['ms_median']:8.1f} ms ({r['time_over_product']:.2f}x)"
        )


if __name__ == "__main__":
    main()
