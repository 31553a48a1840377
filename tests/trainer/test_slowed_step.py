"""The simulated slower machine: it waits out its slowdown asleep, or spinning on its core."""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.optimizers as optim

from trainer.data.dataset import SyntheticStream
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT
from trainer.step import SlowedStepper, zeros_f32

FACTOR = 8.0


def _cpu_share(busy: bool) -> float:
    """This thread's CPU seconds over the wall seconds of a microstep slowed FACTOR times (the
    most of 3: a loaded machine only takes CPU away)."""
    model = GPT(ModelConfig.from_sizes(depth=1, width=32, heads=2, vocab=64, seq_len=16))
    model.init_weights(1)
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(model.trainable_parameters())
    stepper = SlowedStepper(
        model, opt, precision="fp32", pad_id=0, grad_clip=1.0, factor=lambda: FACTOR, busy=busy
    )
    batch = mx.array(SyntheticStream(64, 16, seed=1).batch(0, 4, 0, 1))
    acc, loss, ntok = zeros_f32(model.trainable_parameters()), mx.array(0.0), mx.array(0.0)
    mx.eval(stepper.microstep(acc, loss, ntok, batch))  # compiles
    shares = []
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.thread_time()
        mx.eval(stepper.microstep(acc, loss, ntok, batch))
        shares.append((time.thread_time() - cpu) / (time.perf_counter() - wall))
    return max(shares)


def test_a_busy_slowdown_holds_its_core_and_a_sleeping_one_frees_it():
    """A slower machine keeps its own core busy: a rank that sleeps its slowdown lends its
    core to the ranks beside it on this machine (two ranks a core each: the scatter of their
    time ratio grew from 0.02-0.05 to up to 0.16-0.24 while one slept, session 37)."""
    asleep, spinning = _cpu_share(busy=False), _cpu_share(busy=True)
    # FACTOR - 1 of FACTOR parts of the microstep are the wait: asleep this thread uses no CPU
    # for them, spinning it uses all it is given
    assert asleep < 0.5
    assert spinning > 0.6
