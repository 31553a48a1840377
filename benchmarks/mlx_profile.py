"""Where an MLX update's time goes: the trainer's update taken apart, each piece timed alone.

    python benchmarks/mlx_profile.py --depth 12 --width 768 --heads 12 --vocab 32768 \
        --seq-len 1024 --local-batch 16 --precision mixed

Each piece is compiled like the trainer's and timed as the median of --reps synchronized runs;
its FLOPs (nanoGPT's count) give the rate it reaches. Pieces: the whole microstep (forward +
backward + FP32 accumulation), the forward alone, one transformer block forward + backward,
attention alone, the MLP alone, the head (final norm, lm_head, softcap, cross-entropy)
forward + backward, and the optimizer step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
from mlx.utils import tree_map

from bench.update import synthetic_stepper
from trainer.data.dataset import SyntheticStream
from trainer.model.loss import head_loss


def timed(fn, reps: int) -> float:
    fn()  # compile and warm up
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (
        ("depth", 12),
        ("width", 768),
        ("heads", 12),
        ("vocab", 32768),
        ("seq-len", 1024),
        ("local-batch", 16),
        ("reps", 10),
    ):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--precision", default="mixed", choices=("fp32", "bf16", "mixed"))
    p.add_argument("--loss-chunk", type=int, default=0, help="as fleet train's (0 = whole)")
    p.add_argument("--grad-checkpoint", action="store_true", help="as fleet train's")
    a = p.parse_args()
    model, opt, stepper = synthetic_stepper(
        depth=a.depth,
        width=a.width,
        heads=a.heads,
        vocab=a.vocab,
        seq_len=a.seq_len,
        precision=a.precision,
        loss_chunk=a.loss_chunk,
        grad_checkpoint=a.grad_checkpoint,
    )
    batch = mx.array(
        SyntheticStream(a.vocab, a.seq_len, 0).batch(0, a.local_batch, 0, a.local_batch)
    )
    mx.eval(model.parameters(), opt.state, batch)
    dt = mx.float32 if a.precision == "fp32" else mx.bfloat16
    B, T, C, V = a.local_batch, a.seq_len, a.width, a.vocab
    tokens = B * T
    results = {}

    def record(name: str, seconds: float, flops: float) -> None:
        results[name] = {"ms": seconds * 1e3, "tflops": flops / seconds / 1e12}

    n = model.num_params()

    def micro():  # as an update's first microstep: the gradients become the accumulators
        out = stepper.microstep(None, None, None, batch)
        mx.eval(out)

    record("microstep", timed(micro, a.reps), model.flops_per_token() * tokens)

    def forward():
        mx.eval(stepper.eval_sums(batch))

    record("forward", timed(forward, a.reps), model.flops_per_token() * tokens / 3)

    x = (mx.random.normal((B, T, C)) * 0.1).astype(dt)
    block = model.blocks[0]
    if a.precision == "mixed":
        block.set_dtype(mx.bfloat16)

    def fb(module, f):
        def loss(params, x):
            module.update(params)
            return f(x).astype(mx.float32).sum()

        g = mx.compile(mx.value_and_grad(loss))
        params = module.trainable_parameters()

        def run():
            mx.eval(g(params, x))
            module.update(params)  # tracing left traced arrays in the module; put them back

        return run

    attn_flops = 3 * (8 * tokens * C * C + 4 * B * T * T * C)  # projections + scores/values
    mlp_flops = 3 * (16 * tokens * C * C)
    record("block", timed(fb(block, block), a.reps), attn_flops + mlp_flops)
    record("attention", timed(fb(block.attn, block.attn), a.reps), attn_flops)
    record("mlp", timed(fb(block.mlp, block.mlp), a.reps), mlp_flops)

    head_w = {"weight": model.lm_head.weight.astype(dt)}
    targets = batch[:, 1:].reshape(-1)
    mask = mx.ones(targets.shape, dtype=mx.float32)

    def head(w, x):  # the trainer's head (trainer/model/loss.py), whole or in --loss-chunk chunks
        return head_loss(x.reshape(-1, C), w["weight"], targets, mask, a.loss_chunk)

    g_head = mx.compile(mx.value_and_grad(head, argnums=(0, 1)))
    record("head+loss", timed(lambda: mx.eval(g_head(head_w, x)), a.reps), 6 * tokens * C * V)

    grads = tree_map(
        lambda p: mx.ones(p.shape, dtype=mx.float32) * 1e-3, model.trainable_parameters()
    )
    ntok = mx.array(float(tokens))
    mx.eval(grads)

    def step():
        norm = stepper.apply(grads, ntok, 1e-4)
        mx.eval(model.parameters(), opt.state, norm)

    record("optimizer", timed(step, a.reps), 0)
    out = {
        "config": vars(a),
        "params": n,
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "pieces": results,
        "depth_x_block_ms": results["block"]["ms"] * a.depth,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
