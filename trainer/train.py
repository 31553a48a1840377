"""Train a GPT on one rank or many: `fleet train`, and each rank under `fleet launch`.

    fleet prepare --stdlib --out /tmp/fleet-data --seq-len 128
    fleet train --data /tmp/fleet-data --depth 2 --width 64 --heads 2 --local-batch 4 \
        --accum 4 --updates 30 --run-dir /tmp/fleet-run --checkpoint-every 10 --eval-every 10
    fleet train --resume latest --run-dir /tmp/fleet-run --updates 40
    fleet launch -n 3 -- train --data /tmp/fleet-data --local-batches 3,2,1 ...

One update is `accum` microsteps. Each microstep consumes the next global microbatch of the
sample order, and rank r reads its own contiguous slice of it, so any split of the same global
batch sees the same samples. Each rank accumulates FP32 gradients of its *summed* token loss;
one bucketed all-reduce per update sums gradients, token counts and loss sums over ranks, and
the optimizer divides by the global token count: the split never changes the math.

The pieces beside this loop: builder.py (folder, data, model, resume, telemetry), run.py (what
a run holds and does between updates), state.py (where the loop is), evaluation.py (val loss,
`best`, early stop, the test sentence), step.py (the update), controller.py and commands.py
(operator commands at a boundary), checkpoint/ (saving and finding checkpoints).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from telemetry.units import MiB
from trainer import commands, evaluation, memory
from trainer.builder import open_run
from trainer.config import TrainConfig
from trainer.controller import KEEPALIVE_S, Controller, stop_on_signals
from trainer.distributed import Cluster, PeerLost
from trainer.optim import Schedule
from trainer.progress import Progress
from trainer.run import ReplicaMismatch, Run
from trainer.step import UpdateFigures


def train(
    cfg: TrainConfig,
    cluster: Cluster,
    resume: Path | None = None,
    explicit: frozenset[str] = frozenset(),
) -> int:
    """Run the loop until `cfg.updates` updates (or a stop command); returns an exit code."""
    say = (lambda msg: print(msg, flush=True)) if cluster.is_root else (lambda msg: None)

    # --- run folder, data, model, optimizer, and the loop state (fresh or resumed)
    run: Run = open_run(cfg, cluster, resume, say, explicit)
    state = run.state
    if cfg.allreduce_bucket_mb:
        cluster.bucket_bytes = run.layout.data.bucket_bytes = int(cfg.allreduce_bucket_mb * MiB)
    schedule = Schedule.from_config(
        cfg, tokens_per_update=cfg.accum * sum(state.split) * run.data.seq_len
    )
    controller = run.controller()
    progress = Progress(cfg.updates)
    watchdog = run.watchdog.start()
    clean = False

    say(run.banner)
    run.announce()  # the `started` event (and `restarted`, when fleet launch relaunched it)
    end = min(cfg.updates, cfg.stop_at) if cfg.stop_at else cfg.updates  # the last update + 1
    try:
        # Ctrl-C, SIGTERM and SIGHUP to any rank become a `stop` at the next boundary.
        with stop_on_signals(controller, say):
            while state.step < cfg.updates:
                step = state.step
                if cfg.stop_at and step >= cfg.stop_at:
                    break  # evaluated and saved below, as the end of a run is

                # --- control: rank 0's next command reaches every rank at this boundary
                boundary(run, controller)
                if run.stopping:
                    break

                # --- evaluation and samples (before the update, so step 0 is measured too)
                evaluated = cfg.eval_every and step % cfg.eval_every == 0
                if evaluated and step > state.start_step and (why := evaluate(run, say)):
                    say(evaluation.stop_early(run, why))  # with a checkpoint
                    break
                # the "test sentence": with each evaluation, and every --sample-every updates
                sampled = cfg.sample_every and step % cfg.sample_every == 0
                if run.layout.samples and (sampled or (evaluated and step and run.data.tokenizer)):
                    sample_text(run, say)  # every rank of a tensor-parallel group takes part

                # --- one update: accum microsteps, the all-reduce, then the optimizer (and,
                # with --overlap, the next update's first microstep started behind it)
                run.seed(step)
                lr = schedule(state.tokens)
                figures = run.stepper.update(
                    run.batches(),
                    lr,
                    sequential=cfg.accum_mode == "sequential",
                    cluster=run.layout.data,  # the replicas: a tensor group sums nothing
                    stage=watchdog.progress,
                    key=run.batch_key(),
                    ahead=None if step + 1 >= end else run.ahead,  # none after the last
                )
                run.advance(figures, lr)
                watchdog.progress("report")
                if not math.isfinite(figures.loss):
                    raise FloatingPointError(
                        f"loss is {figures.loss} at update {state.step}; stopping"
                    )

                # --- report: telemetry gets every update; the printed line every log_every
                rec = run.record(figures, mem := memory.figures())
                if cluster.is_root:  # a spiking loss, falling throughput: someone is told
                    run.alerts.watch(state.step, figures.loss, figures.tokens / figures.update_s)
                if state.step % cfg.log_every == 0 or state.step == cfg.updates:
                    say(progress.line(rec, gather_rank_figures(cluster, figures, mem.peak)))

                # --- checkpoint
                if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0:
                    run.save()

            # --- the end (or --stop-at): the model the run ends with is evaluated too, as
            # nanochat's last step is, so `best` can be the final model; a stop command or a
            # signal ends at once instead (its checkpoint is saved; evaluation would delay it)
            if not run.stopping:
                last = state.evals[-1][0] if state.evals else None
                if cfg.eval_every and state.step > state.start_step and last != state.step:
                    evaluate(run, say)  # patience is moot now: the run ends here anyway
                    if cluster.is_root and run.data.tokenizer:
                        sample_text(run, say)
                if run.saved_at != state.step:
                    run.save()
        if run.saved_at != state.step:  # the last save failed: say what is not saved
            print(
                f"fleet train: stopped at update {state.step} without a checkpoint of it; "
                f"resume from {run.last_saved or 'the start'} (free some disk first)",
                file=sys.stderr,
                flush=True,
            )
            return 1
        if state.step < cfg.updates:  # --stop-at, a stop command, a signal, an early stop
            how = f"{state.step} of {cfg.updates} ({run.stop_reason or '--stop-at'})"
            say(
                f"stopped at update {how}; checkpoint {run.last_saved}; to go on: "
                f"{run.resume_command()}"
            )
        else:
            say(f"done: {state.step} updates, {state.tokens:,} tokens; checkpoint {run.last_saved}")
        clean = True
        return 0
    except FloatingPointError as e:
        return run.fail(str(e), 5, alert="loss")
    except PeerLost as e:
        who = run.culprit() or e
        return run.fail(
            f"lost contact with a peer rank during '{watchdog.stage}' at update "
            f"{state.step} ({who}). The run stopped; resume with --resume latest once "
            "every rank is back.",
            1,
        )
    except ReplicaMismatch as e:
        return run.fail(str(e), 4)
    finally:
        watchdog.stop()
        if clean:  # a rank that failed leaves its last beat, for the others to name it
            run.forget_beat()
        run.commands.refuse_all("the run has ended")
        run.alerts.close()
        run.reporter.close()


def evaluate(run: Run, say) -> str | None:
    """Evaluate at this boundary and keep `best`; why the run should stop early, or None."""
    run.watchdog.progress("eval")
    val_loss, val_tokens = evaluation.evaluate(run)
    say(f"eval  step {run.state.step}: val loss {val_loss:.4f} over {val_tokens:,} tokens")
    return evaluation.note_eval(run, val_loss, val_tokens)


def sample_text(run: Run, say) -> None:
    """A sample from --prompt, printed and sent as an event by rank 0 (in tensor parallelism
    the whole group generates it: each rank holds a slice of the model)."""
    text = evaluation.sample(run)
    say(f"sample step {run.state.step}: {text!r}")
    if run.cluster.is_root:
        run.event("sample", text[:200], prompt=run.cfg.prompt, text=text)


def boundary(run: Run, controller: Controller) -> None:
    """Apply rank 0's next command on every rank; while paused, keep exchanging keepalives
    until a resume or a stop arrives. Each exchange carries what this rank measured in its
    last update, for rank 0's memory caps and autopilot."""
    run.watchdog.progress("control")
    while True:
        commands.apply(run, controller.exchange(run.state.split, **run.measured))
        if run.stopping or not controller.paused:
            return
        # Paused: a keepalive about twice a second keeps every collective bounded and notices
        # a dead peer.
        time.sleep(KEEPALIVE_S)
        run.watchdog.progress("paused")


def gather_rank_figures(
    cluster: Cluster, figures: UpdateFigures, peak: int
) -> list[tuple[float, float, float]]:
    """(compute, wait, peak) of every rank: a tiny all-reduce, only when a line is printed."""
    vec = [0.0] * (3 * cluster.size)
    vec[3 * cluster.rank : 3 * cluster.rank + 3] = [figures.compute_s, figures.wait_s, peak]
    flat = cluster.all_sum_floats(vec)
    return [tuple(flat[3 * r : 3 * r + 3]) for r in range(cluster.size)]
