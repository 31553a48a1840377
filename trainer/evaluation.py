"""Evaluating a run: the held-out loss, the `best` checkpoint and early stopping, the test
sentence. Every rank calls these at the same boundary (the loss is summed over ranks), so all
decide alike; the sample is rank 0's alone."""

from __future__ import annotations

import mlx.core as mx

from trainer.checkpoint import catalog
from trainer.data.dataset import val_batches
from trainer.model.generate import generate
from trainer.run import Run

SYNTHETIC_VAL_OFFSET = 1 << 40  # held-out synthetic samples live far beyond any cursor


def evaluate(run: Run) -> tuple[float, int]:
    """Token-weighted loss on the held-out rows; ranks share the batches, then sum."""
    c, batch = run.layout.data, max(run.state.split)  # a tensor group evaluates alike
    limit = run.cfg.eval_samples or None
    if run.data.dataset is not None:
        batches = val_batches(run.data.dataset, batch, limit)
    else:
        n = limit or 64
        batches = (
            run.data.stream.batch(SYNTHETIC_VAL_OFFSET + i, n, 0, min(batch, n - i))
            for i in range(0, n, batch)
        )
    loss, tokens = 0.0, 0.0
    for i, b in enumerate(batches):
        if i % c.size == c.rank:
            ls, nt = run.stepper.eval_sums(mx.array(b))
            mx.eval(ls, nt)
            loss, tokens = loss + ls.item(), tokens + nt.item()
    loss, tokens = c.all_sum_floats([loss, tokens])
    return loss / max(tokens, 1.0), int(tokens)


def note_eval(run: Run, val_loss: float, val_tokens: int) -> str | None:
    """Report an evaluation, keep the best checkpoint and count evaluations without progress;
    returns why the run should stop early (without "early stop at update N: "), or None.
    Every rank calls it with the same loss (summed over ranks): all decide alike.

    One rule for `best`, shared by the report, `checkpoints/best`, `export --best` and
    `sample --best`: the lowest validation loss so far. --early-stop-min-delta only decides
    whether an evaluation counts as progress for --early-stop-patience: it must be lower than
    the last one that counted by more than the delta (Keras's EarlyStopping rule).
    """
    s, cfg = run.state, run.cfg
    s.note_eval(val_loss)
    before = s.best
    if before is None or val_loss < before["val_loss"]:
        s.best = {"step": s.step, "val_loss": val_loss}
        path = run.save() if run.saved_at != s.step else run.last_saved
        if path is not None and run.cluster.is_root:
            catalog.point_best(cfg.run_dir, path)
    best = s.best
    run.event(
        "eval",
        f"val loss {val_loss:.4f} (best {best['val_loss']:.4f} at update {best['step']})",
        val_loss=val_loss,
        val_tokens=val_tokens,
        best_val_loss=best["val_loss"],
        best_step=best["step"],
    )
    mark = s.progress or before  # a resumed session measures progress from the best
    if mark is None or val_loss < mark["val_loss"] - cfg.early_stop_min_delta:
        s.progress, s.evals_since_progress = {"step": s.step, "val_loss": val_loss}, 0
        return None
    s.evals_since_progress += 1
    if not cfg.early_stop_patience or s.evals_since_progress < cfg.early_stop_patience:
        return None
    recent = s.evals[-cfg.early_stop_patience :]
    seen = ", ".join(f"{loss:.4f} (update {step})" for step, loss in recent)
    by = f" by --early-stop-min-delta {cfg.early_stop_min_delta:g}"
    return (
        f"the last {len(recent)} evaluations ({seen}) were none lower than "
        f"{mark['val_loss']:.4f} (update {mark['step']}){by if cfg.early_stop_min_delta else ''}; "
        f"the best validation loss is {best['val_loss']:.4f} at update {best['step']} "
        "(checkpoints/best)"
    )


def stop_early(run: Run, why: str) -> str:
    """End the run at this boundary with a checkpoint, the reason in the log; returns the
    line to print."""
    path = run.save() if run.saved_at != run.state.step else run.last_saved
    run.event("stopped", why, reason="early stop", checkpoint=str(path or ""))
    run.stopping, run.stop_reason = True, "early stop"
    return f"early stop at update {run.state.step}: {why}"


def sample(run: Run) -> str:
    """Text generated from the prompt: rank 0 alone, or with tensor parallelism every rank of
    replica 0's group together (its forward pass is a collective; all pick the same ids)."""
    if run.data.tokenizer is None:
        return "(no tokenizer: synthetic data)"
    tok, prompt = run.data.tokenizer, run.cfg.prompt
    ids = generate(
        run.model,
        [int(t) for t in tok.encode(prompt)],
        run.cfg.sample_tokens,
        seed=run.cfg.seed + run.state.step,
    )
    return prompt + tok.decode(ids)
