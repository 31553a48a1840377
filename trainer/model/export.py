"""`fleet export`: a checkpoint as a model folder of mlx-lm's own `nanochat` model type.

`mlx_lm.load(DIR)` reads config.json (the fields of nanochat's ModelArgs), model.safetensors
(under its weight names) and the tokenizer files transformers' AutoTokenizer reads. Our GPT
and mlx-lm's nanochat were compared detail by detail; one differs, and is converted exactly:

- rotary direction: mx.fast.rope turns each pair (x1, x2) of the half-split layout by +θ;
  mlx-lm's nanochat (like nanochat's own code) by -θ, through negated frequencies. Turning
  by -θ is negating x2, turning by +θ and negating x2 again; the gain-free QK-norm passes the
  sign through and it cancels in q·k. So the export negates the second half of each head's
  rows of c_q and c_k: exact, and the logits are equal (up to float rounding of the angles).

The same on both sides, checked where a config could differ (and refused, never exported
approximately, where it does): the half-split rotary layout (traditional=False) and base;
QK-norm after rotary; RMSNorm without gains, eps 1e-5 (mlx-lm hard-codes it); the logit
softcap of 15 (hard-coded too); ReLU², 4x MLP, no biases, untied head, as many KV heads as
heads. The vocabulary padding goes along as it is: vocab_size is the padded size, the
tokenizer keeps its own, and ids beyond it decode to nothing on both sides.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from trainer.checkpoint import catalog
from trainer.model.config import LOGIT_SOFTCAP, ModelConfig
from trainer.model.trained import Trained

MODEL_TYPE = "nanochat"
MLX_LM_NORM_EPS, MLX_LM_SOFTCAP = 1e-5, 15.0  # constants in mlx_lm/models/nanochat.py
ORIGIN = "origin.json"  # where the model came from: our manifest's identity
DTYPES = {"fp32": mx.float32, "bf16": mx.bfloat16}
CONVERSIONS = [
    "rotary direction: the second half of each head's rows of c_q and c_k negated "
    "(mlx-lm's nanochat turns the other way)"
]


class ExportError(ValueError):
    """A model that cannot be exported exactly, or an --out that must not be replaced."""


def mlx_lm_config(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for mlx-lm's nanochat, or ExportError naming what it cannot represent."""
    problems = []
    if cfg.norm_eps != MLX_LM_NORM_EPS:
        problems.append(f"RMSNorm eps {cfg.norm_eps:g} (mlx-lm's nanochat fixes it at 1e-5)")
    if LOGIT_SOFTCAP != MLX_LM_SOFTCAP:
        problems.append(f"logit softcap {LOGIT_SOFTCAP:g} (mlx-lm's nanochat fixes it at 15)")
    if problems:
        raise ExportError(f"cannot be exported exactly to mlx-lm's nanochat: {'; '.join(problems)}")
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["NanoChatForCausalLM"],
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.heads,
        "vocab_size": cfg.vocab,
        "max_position_embeddings": cfg.seq_len,
        "intermediate_size": 4 * cfg.width,
        "rope_theta": cfg.rope_base,
        "tie_word_embeddings": False,
    }


def mlx_lm_weights(params: dict[str, mx.array], cfg: ModelConfig, dtype: mx.Dtype) -> dict:
    """Our parameters under mlx-lm's names, with the rotary sign flip, in `dtype`."""
    head_dim = cfg.width // cfg.heads
    half = head_dim // 2
    # +1 for the first half of every head's dimensions, -1 for the second: rows of c_q/c_k.
    flip = mx.tile(mx.concatenate([mx.ones(half), -mx.ones(half)]), cfg.heads)[:, None]
    out = {}
    for name, w in params.items():
        if name.endswith(("attn.c_q.weight", "attn.c_k.weight")):
            w = w * flip.astype(w.dtype)  # a sign change: exact in any dtype
        if name.startswith("wte."):
            name = "transformer." + name
        elif name.startswith("blocks."):
            name = "transformer.h." + name.removeprefix("blocks.")
        out[name] = w.astype(dtype)
    return out


def origin(trained: Trained, dtype: str) -> dict[str, Any]:
    """origin.json: which checkpoint, model, tokenizer and data this export came from."""
    m = trained.manifest
    return {
        "exported_by": "mlx-fleet (fleet export)",
        "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "checkpoint": str(trained.path.resolve()),
        "weights_sha256": m.get("files", {}).get(catalog.WEIGHTS, {}).get("sha256"),
        "step": trained.step,
        "val_loss": trained.val_loss,
        "architecture": m.get("architecture"),
        "tokenizer": m.get("tokenizer"),
        "dataset": m.get("dataset"),
        "precision": m.get("precision"),
        "dtype": dtype,
        "conversions": CONVERSIONS,
    }


def export(
    trained: Trained,
    out: str | Path,
    *,
    dtype: str = "fp32",
    force: bool = False,
    tokenizer: str | None = None,
) -> Path:
    """Write the mlx-lm folder `out` from `trained`; returns its path.

    Everything is checked before anything is written, and the folder is assembled beside
    `out` and renamed into place: an existing export is replaced whole or not at all.
    """
    out = Path(out)
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    config = mlx_lm_config(trained.cfg)
    tok_files = trained.tokenizer(tokenizer).hf_files(trained.cfg.seq_len)
    _check_out(out, force)
    weights = mlx_lm_weights(trained.weights(), trained.cfg, DTYPES[dtype])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        texts = {
            "config.json": json.dumps(config, indent=2) + "\n",
            ORIGIN: json.dumps(origin(trained, dtype), indent=2) + "\n",
            **tok_files,
        }
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if out.exists():
            old = out.parent / f".old-{out.name}-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _check_out(out: Path, force: bool) -> None:
    """Refuse an --out that exists unless --force, and even then anything but an export."""
    if not out.exists() and not out.is_symlink():
        return
    if not force:
        raise ExportError(f"{out} exists: pass --force to replace it, or choose another --out")
    if not out.is_dir() or (any(out.iterdir()) and not (out / ORIGIN).is_file()):
        raise ExportError(
            f"{out} exists and is not an export (no {ORIGIN}); --force replaces only an "
            "earlier export: remove it yourself or choose another --out"
        )
