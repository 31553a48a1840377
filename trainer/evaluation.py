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
    """Report an evaluation, keep the best checkpoint (`best`, never pruned) and count
    evaluations without a new best; returns why the run should stop early, or None.
    Every rank calls it with the same loss (summed over ranks): all decide alike."""
    s, cfg = run.state, run.cfg
    s.note_eval(val_loss)
    best = s.best
    improved = best is None or val_loss < best["val_loss"] - cfg.early_stop_min_delta
    if improved:
        best = s.best = {"step": s.step, "val_loss": val_loss}
        s.evals_since_best = 0
        path = run.save() if run.saved_at != s.step else run.last_saved
        if path is not None and run.cluster.is_root:
            catalog.point_best(cfg.run_dir, path)
    run.event(
        "eval",
        f"val loss {val_loss:.4f} (best {best['val_loss']:.4f} at update {best['step']})",
        val_loss=val_loss,
        val_tokens=val_tokens,
        best_val_loss=best["val_loss"],
        best_step=best["step"],
    )
    if improved:
        return None
    s.evals_since_best += 1
    if not cfg.early_stop_patience or s.evals_since_best < cfg.early_stop_patience:
        return None
    recent = s.evals[-cfg.early_stop_patience :]
    seen = ", ".join(f"{loss:.4f} (update {step})" for step, loss in recent)
    return (
        f"early stop at update {s.step}: the best validation loss is "
        f"{best['val_loss']:.4f} at update {best['step']}; the last {len(recent)} "
        f"evaluations ({seen}) were none lower by --early-stop-min-delta "
        f"{cfg.early_stop_min_delta:g}; resume with --resume latest to go on"
    )


def stop_early(run: Run, why: str) -> None:
    """End the run at this boundary with a checkpoint, the reason in the log."""
    path = run.save() if run.saved_at != run.state.step else run.last_saved
    run.event("stopped", why, reason="early stop", checkpoint=str(path or ""))
    run.stopping = True


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
