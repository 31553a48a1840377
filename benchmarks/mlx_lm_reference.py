"""mlx-lm's own trainer on its nanochat model, at the trainer's benchmark size: a reference
beside `fleet bench throughput` and torch_reference.py.

    python benchmarks/mlx_lm_reference.py --json          # depth 12, width 768, 16 x 1024, bf16
    python benchmarks/mlx_lm_reference.py --depth 4 --width 256 --heads 4 --vocab 512 \
        --seq-len 256 --local-batch 4 --accum 4 --precision fp32 --device cpu --json

mlx-lm is an optional benchmark dependency (`pip install mlx-lm`), never the product's; only
this script imports it. What runs is `mlx_lm.tuner.trainer.train` itself (its compiled step,
its gradient accumulation, its `--grad-checkpoint`, its own loss: the mean cross-entropy of
`default_loss`) on `mlx_lm.models.nanochat.Model` (rotary, weightless RMSNorm, QK-norm, ReLU²,
softcap 15, untied head: the architecture of trainer/model/gpt.py), every weight trained, with
AdamW as fleet's (betas 0.9/0.95, eps 1e-8, weight decay 0.1, bias correction) on synthetic
tokens. mlx-lm's trainer does not clip gradients; fleet clips at 1.0. The weights are in the
`--precision` dtype (bf16, as mlx-lm fine-tunes: there is no FP32 master copy) or FP32.

`--memory-limit-gb tight` measures its live set (the peak with no run-ahead; slow on a GPU).

Timing: mlx-lm's own report, one report per update (`steps_per_report` = accum), tokens/s
over the time its loop spent in that update; the first `--warmup` reports (compilation) are
dropped and the median of the rest is taken. Peak memory: MLX's peak active memory from the
end of the warmup to the end of the run. Prints the keys of `fleet bench throughput --json`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import statistics
import sys
import tempfile
import types
from pathlib import Path

# What mlx_lm imports at module level for loading checkpoints and tokenizing, none of which
# its trainer calls. The GPU machine has none of them: where one is missing, a stand-in that
# accepts anything at import time is put in its place (and fails loudly if really used).
LOADING_MODULES = ("transformers", "huggingface_hub", "tokenizers", "sentencepiece", "modelscope")


class _Absent(type):
    """A stand-in class: any attribute or call yields the stand-in, at import time only."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args, **kwargs):
        return cls

    def __mro_entries__(cls, bases):
        return (object,)


class _Stand(metaclass=_Absent):
    pass


def _stand_in_attribute(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Stand


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in LOADING_MODULES:
            return None
        for finder in sys.meta_path:  # a real module wins
            if finder is not self and (spec := finder.find_spec(name, path, target)):
                return spec
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _stand_in_attribute
        return module

    def exec_module(self, module) -> None:
        STANDINS.append(module.__name__)


STANDINS: list[str] = []


def import_mlx_lm():
    """mlx_lm's trainer module and nanochat model module, with stand-ins where needed."""
    if importlib.util.find_spec("mlx_lm") is None:
        sys.exit("mlx_lm_reference: mlx-lm is not installed (pip install mlx-lm)")
    sys.meta_path.insert(0, _StandInFinder())
    from mlx_lm.models import nanochat
    from mlx_lm.tuner import trainer

    return trainer, nanochat


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (
        ("depth", 12),
        ("width", 768),
        ("heads", 12),
        ("vocab", 32768),
        ("seq-len", 1024),
        ("local-batch", 16),
        ("accum", 1),
    ):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--updates", type=int, default=20, help="measured updates")
    p.add_argument("--warmup", type=int, default=3, help="updates before measuring")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--grad-checkpoint", action="store_true", help="mlx-lm's --grad-checkpoint")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument(
        "--memory-limit-gb",
        default="0",
        help="MLX memory limit for the whole run: GiB, 0 (none: MLX's default), or tight (a "
        "limit every allocation passes: the measured peak is the live set)",
    )
    p.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak, for MFU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import mlx.core as mx
    import mlx.optimizers as optim
    import numpy as np

    if args.device != "auto":
        mx.set_default_device(mx.cpu if args.device == "cpu" else mx.gpu)
    if args.memory_limit_gb == "tight":
        mx.set_memory_limit(1)  # eval waits for the stream after each task: no run-ahead
    elif float(args.memory_limit_gb) > 0:
        mx.set_memory_limit(int(float(args.memory_limit_gb) * 2**30))
    trainer, nanochat = import_mlx_lm()
    import mlx_lm

    B, T, accum = args.local_batch, args.seq_len, args.accum
    model = nanochat.Model(
        nanochat.ModelArgs(
            hidden_size=args.width,
            num_hidden_layers=args.depth,
            num_attention_heads=args.heads,
            num_key_value_heads=args.heads,
            vocab_size=args.vocab,
            max_position_embeddings=T,
            intermediate_size=4 * args.width,
        )
    )
    if args.precision == "bf16":
        model.set_dtype(mx.bfloat16)
    from mlx.utils import tree_flatten

    n_params = sum(p.size for _, p in tree_flatten(model.parameters()))
    optimizer = optim.AdamW(
        learning_rate=1e-4, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, bias_correction=True
    )
    mx.eval(model.parameters())

    rng = np.random.default_rng(args.seed)
    lengths = mx.array([[0, T]] * B)  # every target counts (default_loss's mask)

    def batches(**_):
        while True:  # rows of T + 1 ids: inputs [:, :-1], targets [:, 1:]
            yield mx.array(rng.integers(0, args.vocab, (B, T + 1), dtype=np.int32)), lengths

    reports: list[dict] = []

    class Measure(trainer.TrainingCallback):
        def on_train_loss_report(self, info: dict) -> None:
            reports.append(info)
            if len(reports) == args.warmup:
                mx.reset_peak_memory()  # the peak of the measured updates only

    iters = accum * (args.warmup + args.updates)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        train_args = trainer.TrainingArgs(
            batch_size=B,
            iters=iters,
            steps_per_report=accum,  # one report per update
            steps_per_eval=iters + 1,
            steps_per_save=iters + 1,
            max_seq_length=T + 1,
            adapter_file=str(Path(tmp) / "weights.safetensors"),
            grad_checkpoint=args.grad_checkpoint,
            grad_accumulation_steps=accum,
        )
        trainer.train(
            model,
            optimizer,
            train_dataset=[None] * B,
            args=train_args,
            iterate_batches=batches,
            training_callback=Measure(),
        )
        peak_bytes = mx.get_peak_memory()

    measured = reports[args.warmup :]
    tokens_per_s = statistics.median(r["tokens_per_second"] for r in measured)
    tokens = B * accum * T
    flops_per_token = 6 * n_params + 12 * args.depth * args.width * T
    peak = args.peak_tflops * 1e12 if args.peak_tflops > 0 else None
    out = {
        "framework": "mlx-lm",
        "mlx_lm": mlx_lm.__version__,
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "precision": args.precision,
        "grad_checkpoint": args.grad_checkpoint,
        "params": n_params,
        "tokens_per_update": tokens,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_all": [r["tokens_per_second"] for r in measured],
        "update_s": tokens / tokens_per_s,
        "peak_bytes": peak_bytes,
        "memory_limit": args.memory_limit_gb,
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "mfu": tokens_per_s * flops_per_token / peak if peak else None,
        "loss_first_last": [reports[0]["train_loss"], reports[-1]["train_loss"]],
        "stand_ins": STANDINS,
        "config": {
            k: getattr(args, k)
            for k in ("depth", "width", "heads", "vocab", "seq_len", "local_batch", "accum")
        }
        | {"updates": args.updates, "warmup": args.warmup},
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"mlx-lm {out['mlx_lm']}: {tokens_per_s:,.0f} tokens/s, update "
        f"{out['update_s'] * 1000:.1f} ms, peak {peak_bytes / 1024**3:.2f} GiB "
        f"({n_params / 1e6:.1f}M params, {args.precision}, {out['device']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
