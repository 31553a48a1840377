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
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from telemetry.records import Event, Update
from trainer import checkpoint, memory
from trainer.config import TrainConfig
from trainer.controller import HEARTBEAT_S, Controller
from trainer.distributed import Cluster, PeerLost, Watchdog
from trainer.optim import Schedule
from trainer.progress import Progress
from trainer.run import Run, open_run
from trainer.step import Stepper, zeros_f32


def train(
    cfg: TrainConfig,
    cluster: Cluster,
    resume: Path | None = None,
    explicit: frozenset[str] = frozenset(),
) -> int:
    """Run the loop until `cfg.updates` updates (or a stop command); returns an exit code."""
    rank, world = cluster.rank, cluster.size
    say = (lambda msg: print(msg, flush=True)) if cluster.is_root else (lambda msg: None)

    # --- run folder, data, model, optimizer, and the loop state (fresh or resumed)
    run: Run = open_run(cfg, cluster, resume, say, explicit)
    model, optimizer, state = run.model, run.optimizer, run.state
    split, accum, seq_len = state["split"], cfg.accum, run.seq_len
    global_batch = sum(split)
    stepper = Stepper(
        model,
        optimizer,
        precision=cfg.precision,
        pad_id=run.pad_id,
        grad_clip=cfg.grad_clip,
        loss_chunk=cfg.loss_chunk,
    )
    schedule = Schedule.from_config(cfg, tokens_per_update=accum * global_batch * seq_len)
    slowdown = cfg.slowdown(world, rank)
    reporter, controller = run.reporter, Controller(cluster, run.commands)
    progress = Progress(cfg.updates)
    watchdog = Watchdog(cfg.collective_timeout, rank, on_expire=run.on_fatal).start()

    # Ctrl-C / SIGTERM on rank 0 become a `stop` at the next boundary (checkpoint, clean exit);
    # a second one interrupts at once.
    previous_handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if cluster.is_root:

        def _stop(signum, frame):
            signal.signal(signum, signal.default_int_handler)
            say(
                f"fleet train: {signal.Signals(signum).name}: stopping at the next update "
                "(again to interrupt now)"
            )
            controller.queue.submit("stop", {"reason": signal.Signals(signum).name})

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)

    saved_at = state["step"] if resume else None

    def save(step: int) -> Path | None:
        """Checkpoint: every rank proves its replica; rank 0 writes. A sync point."""
        nonlocal saved_at
        saved_at = step
        watchdog.progress("checkpoint")
        digests = cluster.gather_bytes(
            checkpoint.replica_digest(model.parameters(), optimizer.state)
        )
        agree = len(set(digests)) == 1
        path = None
        if cluster.is_root:
            path = checkpoint.save(
                cfg.run_dir,
                step,
                params=model.parameters(),
                optimizer_state=optimizer.state,
                state={**state, "step": step, "rng": "reseeded from --seed and the step"},
                config=cfg.to_dict(),
                identity={**run.identity, "replicas_agree": agree},
                keep=cfg.keep_checkpoints,
                make_latest=agree,
            )
            reporter.on_event(
                Event(
                    "checkpoint",
                    rank,
                    step,
                    f"saved {path}",
                    {"path": str(path), "verified": agree},
                )
            )
        if not agree:
            majority = max(set(digests), key=digests.count)
            differ = [r for r, d in enumerate(digests) if d != majority]
            raise ReplicaMismatch(
                f"replicas disagree at update {step}: rank(s) {differ} differ from the others; "
                f"checkpoint {path or ''} kept but not made latest"
            )
        return path

    say(run.banner)
    reporter.on_event(
        Event(
            "started",
            rank,
            state["step"],
            run.banner,
            {
                "world_size": world,
                "split": split,
                "updates": cfg.updates,
                "config_digest": cfg.digest(),
            },
        )
    )
    step, stopping, last_saved = state["step"], False, None
    try:
        while step < cfg.updates and not stopping:
            if cfg.stop_at and step >= cfg.stop_at:
                say(f"stopping at update {step} (--stop-at); resume with --resume latest")
                break
            # --- control: rank 0's next command reaches every rank at this boundary
            watchdog.progress("control")
            action = controller.exchange(split, run.mem_caps)
            while True:
                if action.name == "pause":
                    reporter.on_event(Event("paused", rank, step, f"paused at update {step}"))
                    Controller.answer(action, step)
                elif action.name == "resume":
                    reporter.on_event(Event("resumed", rank, step, f"resumed at update {step}"))
                    Controller.answer(action, step)
                elif action.name == "checkpoint":
                    last_saved = save(step)
                    Controller.answer(action, step, path=str(last_saved or ""))
                elif action.name == "rebalance":
                    old, split = split, action.payload
                    state["split"] = run.identity["split"] = split
                    reporter.set_hello(local_batch=split[rank])
                    reporter.on_event(
                        Event(
                            "rebalanced",
                            rank,
                            step,
                            f"split {old} -> {split}",
                            {"from": old, "to": split},
                        )
                    )
                    Controller.answer(action, step, split=split)
                elif action.name == "stop":
                    stopping = True
                    last_saved = save(step)
                    reporter.on_event(
                        Event(
                            "stopped",
                            rank,
                            step,
                            "stopped by command",
                            {"checkpoint": str(last_saved or "")},
                        )
                    )
                    Controller.answer(action, step, path=str(last_saved or ""))
                if stopping or not controller.paused:
                    break
                # Paused: a heartbeat about twice a second keeps every collective bounded and
                # notices a dead peer.
                time.sleep(HEARTBEAT_S)
                watchdog.progress("paused")
                action = controller.exchange(split, run.mem_caps)
            if stopping:
                break

            # --- evaluation and samples (before the update, so step 0 is measured too)
            if cfg.eval_every and step % cfg.eval_every == 0 and step > state["start_step"]:
                watchdog.progress("eval")
                val_loss, val_tokens = run.evaluate(stepper)
                say(f"eval  step {step}: val loss {val_loss:.4f} over {val_tokens:,} tokens")
                reporter.on_event(
                    Event(
                        "eval",
                        rank,
                        step,
                        f"val loss {val_loss:.4f}",
                        {"val_loss": val_loss, "val_tokens": val_tokens},
                    )
                )
            if cfg.sample_every and step % cfg.sample_every == 0 and cluster.is_root:
                text = run.sample(model)
                say(f"sample step {step}: {text!r}")
                reporter.on_event(
                    Event("sample", rank, step, text[:200], {"prompt": cfg.prompt, "text": text})
                )

            # --- one update: accum microsteps, then the all-reduce, then AdamW
            watchdog.progress("compute")
            # The global RNG is reseeded from (seed, step) every update, so anything random in
            # an update (none today; dropout tomorrow) resumes exactly without saving its state.
            mx.random.seed(cfg.seed * 1_000_003 + step)
            t_start = time.perf_counter()
            memory.reset_peak()
            local, offset = split[rank], sum(split[:rank])
            cursor = state["cursor"]
            acc = zeros_f32(model.trainable_parameters())
            loss_sum, ntok = mx.array(0.0), mx.array(0.0)
            if cfg.accum_mode == "sequential":
                for micro in range(accum):
                    batch = mx.array(
                        run.stream.batch(cursor + micro * global_batch, global_batch, offset, local)
                    )
                    t_micro = time.perf_counter()
                    acc, loss_sum, ntok = stepper.microstep(acc, loss_sum, ntok, batch)
                    mx.eval(acc, loss_sum, ntok)  # materialize: frees this microbatch's graph
                    if slowdown > 1:  # stand in for a slower machine, in tests and demos
                        time.sleep((slowdown - 1) * (time.perf_counter() - t_micro))
            else:
                batches = [
                    mx.array(
                        run.stream.batch(cursor + m * global_batch, global_batch, offset, local)
                    )
                    for m in range(accum)
                ]
                acc, loss_sum, ntok = stepper.unrolled(batches)
                mx.eval(acc, loss_sum, ntok)
            compute_s = time.perf_counter() - t_start

            watchdog.progress("barrier")
            wait_s = cluster.barrier()  # time spent waiting for the slowest rank
            watchdog.progress("all-reduce")
            t0 = time.perf_counter()
            local_tokens = int(ntok.item())
            grads, sums = cluster.sum_gradients(
                acc, mx.stack([loss_sum, ntok]), int(cfg.allreduce_bucket_mb * 1024**2)
            )
            mx.eval(grads, sums)
            transfer_s = time.perf_counter() - t0

            watchdog.progress("optimizer")
            t0 = time.perf_counter()
            update_tokens = int(sums[1].item())
            lr = schedule(state["tokens"])
            grad_norm = stepper.apply(grads, sums[1], lr)
            mx.eval(model.parameters(), optimizer.state, grad_norm)
            optimizer_s = time.perf_counter() - t0
            update_s = time.perf_counter() - t_start

            step += 1
            state.update(
                step=step,
                tokens=state["tokens"] + update_tokens,
                cursor=cursor + accum * global_batch,
                lr=lr,
            )
            mem = memory.figures()
            loss = float(sums[0].item()) / max(1, update_tokens)
            if not np.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at update {step}; stopping")

            # --- report: telemetry gets every update; the printed line is every log_every
            rec = Update(
                rank=rank,
                step=step,
                tokens=state["tokens"],
                update_tokens=update_tokens,
                local_tokens=local_tokens,
                loss=loss,
                lr=lr,
                grad_norm=float(grad_norm.item()),
                local_batch=local,
                microsteps=accum,
                compute_s=compute_s,
                wait_s=wait_s,
                transfer_s=transfer_s,
                optimizer_s=optimizer_s,
                update_s=update_s,
                active_mem=mem.active,
                peak_mem=mem.peak,
                cache_mem=mem.cache,
                tokens_per_s=local_tokens / update_s if update_s > 0 else 0.0,
                simulated=slowdown > 1,
                **run.system_memory(),
            )
            reporter.on_update(rec)
            if step % cfg.log_every == 0 or step == cfg.updates:
                ranks = gather_rank_figures(cluster, compute_s, wait_s, mem.peak)
                say(progress.line(rec, ranks))
                run.mem_caps = memory_caps(cfg, split, [peak for _, _, peak in ranks])

            # --- checkpoint
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                last_saved = save(step)

        if not stopping and saved_at != step:
            last_saved = save(step)
        say(f"done: {step} updates, {state['tokens']:,} tokens; checkpoint {last_saved}")
        return 0
    except PeerLost as e:
        msg = (
            f"fleet train: rank {rank}: lost contact with a peer rank during "
            f"'{watchdog.stage}' at update {step} ({e}). The run stopped; resume with "
            f"--resume latest once every rank is back."
        )
        print(msg, file=sys.stderr, flush=True)
        run.on_fatal(msg)
        return 1
    except ReplicaMismatch as e:
        print(f"fleet train: rank {rank}: {e}", file=sys.stderr, flush=True)
        run.on_fatal(str(e))
        return 4
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        watchdog.stop()
        controller.queue.refuse_all("the run has ended")
        reporter.close()


def memory_caps(cfg: TrainConfig, split: list[int], peaks: list[float]) -> list[int | None]:
    """The largest local batch each rank's --memory-limit-gb allows, from its measured peak.

    Peak per sample is taken as peak / local batch, which overstates it (the weights count
    too), so the caps err on the safe side. None where a rank has no limit.
    """
    world, caps = len(split), []
    for r, (batch, peak) in enumerate(zip(split, peaks, strict=True)):
        limit = cfg.per_rank("memory_limit_gb", world, r)
        caps.append(
            None
            if limit is None or peak <= 0
            else max(1, int(limit * memory.GiB // (peak / batch)))
        )
    return caps


class ReplicaMismatch(RuntimeError):
    """Ranks that should hold identical weights do not."""


def gather_rank_figures(
    cluster: Cluster, compute_s: float, wait_s: float, peak: int
) -> list[tuple[float, float, float]]:
    """(compute, wait, peak) of every rank: a tiny all-reduce, only when a line is printed."""
    vec = [0.0] * (3 * cluster.size)
    vec[3 * cluster.rank : 3 * cluster.rank + 3] = [compute_s, wait_s, float(peak)]
    flat = cluster.all_sum_floats(vec)
    return [tuple(flat[3 * r : 3 * r + 3]) for r in range(cluster.size)]
