"""Issue 23 in one process: each speed lever against its absence in interleaved rounds, ours
against torch.compile in the same rounds, the profile's pieces, and the fused QK-norm + rotary
kernel checked against the plain path (forward and backward) on this device.

    python benchmarks/gpu_speed.py --out OUT                 # issue 12's configuration, GPU
    python benchmarks/gpu_speed.py --out OUT --tiny --device cpu   # the logic, tiny, on a CPU
    python benchmarks/gpu_speed.py report OUT/gpu-speed.json       # the tables again

Sections, in the order of what matters most (each stops starting work past --deadline-s, and
OUT/gpu-speed.json is rewritten after each, so a cut run keeps what it measured):
  check    in a child process (a CUDA fault there cannot end this one): the kernel against
           its ops mirror and the plain path, forward and backward, several shapes, dtypes,
           offsets and both layouts; the model's logits and gradients with each path. Variants
           that need the kernel are dropped when it fails (recorded, not fatal).
  levers   one model and AdamW, one Stepper per variant (its own compiled graph); a compiling
           round, then --rounds rounds of --updates timed updates each (Stepper.update, the
           trainer's), the variants' order turned each round, and torch.compile's round
           (benchmarks/torch_reference.py --sync, compiled once in a child process meanwhile)
           after ours in each. Median update -> tokens/s; the last update's peak.
  profile  pieces compiled and timed alone (median of --reps): QK-norm + rotary with each
           path, SDPA on heads-first and token-major inputs, the attention module and a block
           with each path, the head whole and chunked, the optimizer step per tensor and flat.
"""

from __future__ import annotations

import argparse
import inspect
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
FULL = dict(depth=12, width=768, heads=12, vocab=32768, seq_len=1024, local_batch=16)
TINY = dict(depth=2, width=64, heads=2, vocab=512, seq_len=64, local_batch=4)


@dataclass(frozen=True)
class Variant:
    """One way to run the update; `lever` names the issue's item it measures."""

    name: str
    lever: str
    attention: str = "plain"
    packed: bool = False  # q, k, v from one matmul (Attention.packed)
    stepper: dict = field(default_factory=dict)  # Stepper keywords (the head's)
    needs_kernel: bool = False
    repack: bool = False  # the flat step as it was: RepackingStepper


def variants(chunk: int) -> list[Variant]:
    return [
        Variant("product", "today's update (what each lever is compared with)"),
        Variant("attn-strided", "3: attention without layout copies", attention="strided"),
        Variant(
            "attn-fused-heads",
            "1: QK-norm + rotary in one pass (heads-first out)",
            attention="fused-heads",
            needs_kernel=True,
        ),
        Variant("attn-fused", "1 + 3: one pass, token-major", attention="fused", needs_kernel=True),
        Variant(
            "attn-fused-qkv",
            "1 + 3 + q, k, v from one matmul",
            attention="fused",
            packed=True,
            needs_kernel=True,
        ),
        head_variant(chunk),
        *flat_variant(),
    ]


def head_variant(chunk: int) -> Variant:
    """Lever 4: the head against the product's. Where the Stepper has a `loss_head` (issue
    20's fused head, its default from a 4k vocabulary), the head as it was (plain autodiff);
    before that, the chunked head of --loss-chunk."""
    from trainer.step import Stepper

    if "loss_head" in inspect.signature(Stepper).parameters:
        return Variant(
            "head-plain", "4: the head as it was (plain)", stepper={"loss_head": "plain"}
        )
    return Variant(f"head-chunk-{chunk}", "4: the head in chunks", stepper={"loss_chunk": chunk})


def flat_variant() -> list[Variant]:
    """Lever 2: one flat optimizer step (--optimizer-step flat), where the Stepper has it;
    the defaults with it as it first was (repacking) and with the head's chunks smaller (the
    default at 32k is 8192 rows: trainer/model/loss.py)."""
    from trainer.step import Stepper

    if "optimizer_step" not in inspect.signature(Stepper).parameters:
        return []
    defaults = dict(attention="fused", packed=True, needs_kernel=True)
    flat = {"optimizer_step": "flat"}
    # --overlap (the next update's first microstep started behind the step): on in the
    # defaults where the Stepper has it; every other variant runs without it (run_levers)
    on = {"overlap": "on"} if "overlap" in inspect.signature(Stepper).parameters else {}
    overlap = [
        Variant("defaults-no-overlap", "the defaults without --overlap (as they were)",
                stepper=flat, **defaults),
    ] if on else []  # fmt: skip
    return [
        Variant("opt-flat", "2: one flat optimizer step", stepper=flat),
        Variant("defaults", "the defaults on CUDA: 1 + 3 + q, k, v from one matmul, 2, and "
                "--overlap", stepper={**flat, **on}, **defaults),
        *overlap,
        Variant("defaults-repack", "the defaults, the flat step packing every update (as it was)",
                stepper=flat, repack=True, **defaults),
        Variant("defaults-chunk-4096", "the defaults, the head in chunks of 4096 rows",
                stepper={**flat, "loss_chunk": 4096}, **defaults),
        Variant("defaults-chunk-2048", "the defaults, the head in chunks of 2048 rows (as it was)",
                stepper={**flat, "loss_chunk": 2048}, **defaults),
    ]  # fmt: skip


def repacking_stepper():
    """The Stepper with the flat step as it first landed (issue 23, 2026-12-02): the gradients
    packed in the optimizer phase and the weights packed again every update."""
    import mlx.core as mx
    from mlx.utils import tree_map

    from trainer.flat import KEY
    from trainer.step import Stepper

    class RepackingStepper(Stepper):
        def _accumulators(self, grads):
            return tree_map(lambda g: g.astype(mx.float32), grads)

        def _keep_packed(self) -> None:
            self.flat[KEY] = self.packing.buffers(self.model.trainable_parameters())

    return RepackingStepper


class Clock:
    """The deadline: sections ask before starting work."""

    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.monotonic(), seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def log(msg: str) -> None:
    print(f"== {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# --- check (run in a child process) ----------------------------------------------------------
def check_main(a: argparse.Namespace) -> None:
    """Print one JSON object: the kernel (or, without one, the ops mirror) against the
    reference paths. Tolerances: FP32 1e-4 of the largest value, bf16 and fp16 3e-2."""
    import mlx.core as mx

    from trainer.model import kernels

    mx.set_default_device(mx.cpu if a.device == "cpu" else mx.gpu)
    out: dict = {"backend": kernels.gpu_backend(), "cases": [], "ok": True}
    cases = [  # shape, dtype, offset, heads-first output, q and k views of a packed buffer
        ((2, 130, 5, 64), mx.bfloat16, 0, False, False),
        ((2, 130, 5, 64), mx.bfloat16, 37, True, False),
        ((2, 130, 5, 64), mx.bfloat16, 5, False, True),
        ((2, 130, 5, 64), mx.float32, 37, False, False),
        ((2, 130, 5, 64), mx.float32, 2, True, True),
        ((1, 7, 3, 16), mx.float32, 3, True, False),
        ((2, 33, 2, 128), mx.float16, 0, False, False),
        ((1, 9, 1, 256), mx.float32, 0, False, False),  # 4 pairs a lane
    ]
    if not a.tiny:  # the measured shape itself
        cases.append(((16, 1024, 12, 64), mx.bfloat16, 0, False, False))
        cases.append(((16, 1024, 12, 64), mx.bfloat16, 0, False, True))
    for shape, dtype, offset, heads_first, packed in cases:
        case = {
            "shape": shape,
            "dtype": str(dtype),
            "offset": offset,
            "heads_first": heads_first,
            "packed": packed,
        }
        try:
            case.update(_check_case(mx, kernels, shape, dtype, offset, heads_first, packed))
        except Exception as e:  # a kernel that does not compile or run: record, go on
            case.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000])
        out["ok"] &= case["ok"]
        out["cases"].append(case)
    try:
        out["model"] = _check_model(mx, kernels)
        out["ok"] &= out["model"]["ok"]
    except Exception as e:
        out["model"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        out["ok"] = False
    print(json.dumps(out))


def _err(mx, got, want) -> float:
    """Largest difference relative to the largest reference value."""
    got, want = got.astype(mx.float32), want.astype(mx.float32)
    return (mx.abs(got - want).max() / (mx.abs(want).max() + 1e-12)).item()


def _check_case(mx, kernels, shape, dtype, offset, heads_first, packed) -> dict:
    kq, kk, kc = mx.random.split(mx.random.key(sum(shape) + offset), 3)
    B, T, H, D = shape
    if packed:  # strided views, as Attention.packed hands them over; cotangents heads-first
        qkv = mx.random.normal((B, T, 3 * H * D), key=kq).astype(dtype)
        q, k, _ = (x.reshape(shape) for x in mx.split(qkv, 3, axis=-1))
        cot = mx.random.normal((2, B, H, T, D), key=kc).astype(dtype)
    else:  # contiguous rows; cotangents token-major (as SDPA's gradients are)
        q = mx.random.normal(shape, key=kq).astype(dtype)
        k = (4.0 * mx.random.normal(shape, key=kk)).astype(dtype)
        cot = mx.random.normal((2, B, T, H, D), key=kc).astype(dtype).transpose(0, 1, 3, 2, 4)
    kw = dict(eps=1e-5, base=10000.0, offset=offset)

    def vjp(f):
        return mx.vjp(lambda a, b: f(a, b, **kw), [q, k], [cot[0], cot[1]])

    fused = vjp(lambda a, b, **kw: kernels.fused(a, b, heads_first=heads_first, **kw))
    ops, plain = vjp(kernels.ops), vjp(kernels.plain)
    mx.eval(fused, ops, plain)
    tol = 1e-4 if dtype == mx.float32 else 3e-2
    errs = {}
    for ref_name, ref in (("ops", ops), ("plain", plain)):
        for part, i in (("forward", 0), ("backward", 1)):
            errs[f"{part}_vs_{ref_name}"] = max(
                _err(mx, g, w) for g, w in zip(fused[i], ref[i], strict=True)
            )
    return {"errors": errs, "tolerance": tol, "ok": max(errs.values()) <= tol}


def _check_model(mx, kernels) -> dict:
    """A small GPT's loss and gradients, compiled, with each path against plain (bf16)."""
    from mlx.utils import tree_flatten

    from bench.update import synthetic_stepper
    from trainer.data.dataset import SyntheticStream

    res, base = {}, None
    for path in kernels.PATHS:
        model, opt, stepper = synthetic_stepper(
            depth=2, width=128, heads=2, vocab=256, seq_len=256, precision="mixed"
        )
        stepper.twin.set_attention(path)
        batch = mx.array(SyntheticStream(256, 256, 0).batch(0, 4, 0, 4))
        acc, loss, _ = stepper.microstep(None, None, None, batch)
        mx.eval(acc, loss)
        grads = dict(tree_flatten(acc))
        if base is None:
            base = (loss.item(), grads)
            continue
        res[path] = {
            "loss_rel": abs(loss.item() - base[0]) / abs(base[0]),
            "grad_rel": max(_err(mx, grads[n], g) for n, g in base[1].items()),
        }
    ok = all(r["loss_rel"] < 1e-3 and r["grad_rel"] < 5e-2 for r in res.values())
    return {"paths": res, "ok": ok}


def run_check(a: argparse.Namespace, clock: Clock) -> dict:
    cmd = [sys.executable, str(HERE / "gpu_speed.py"), "check", "--device", a.device]
    cmd += ["--tiny"] if a.tiny else []
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=max(10.0, min(240.0, clock.left()))
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timed out"}
    seconds = time.monotonic() - t0
    try:
        res = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        res = {"ok": False, "error": f"exit {p.returncode}: {p.stderr[-2000:]}"}
    res["seconds"] = seconds
    return res


# --- torch.compile in a child process, one round per line ------------------------------------
class TorchWorker:
    """torch_reference.py --compile --sync: compiles while we warm up, then runs a round of
    timed updates whenever asked. Absent (recorded) where torch is not importable."""

    def __init__(self, a: argparse.Namespace, cfg: dict) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.error: str | None = None
        self.ready: dict | None = None
        sizes = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.items()]
        cmd = [sys.executable, str(HERE / "torch_reference.py"), *sizes, "--compile"]
        cmd += ["--updates", str(a.updates), "--warmup", str(a.torch_warmup)]
        cmd += ["--rounds", str(a.rounds), "--sync"]
        cmd += ["--device", "cpu"] if a.device == "cpu" else []
        self.stderr = Path(a.out) / "torch.err"
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr.open("w"),
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _next(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.error = self.error or f"no answer in {timeout:.0f} s"
                return None
            if line is None:
                tail = self.stderr.read_text()[-1500:]
                self.error = self.error or f"exited {self.proc.wait()}: {tail}"
                return None
            if line.startswith("{"):
                return json.loads(line)

    def wait_ready(self, timeout: float) -> bool:
        if self.ready is None and self.error is None:
            self.ready = self._next(timeout)
        return self.ready is not None

    def round(self, timeout: float) -> dict | None:
        if self.error or self.ready is None:
            return None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._next(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.ready is None:  # still compiling: it will not be asked for a round
                self.proc.kill()
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


# --- levers -----------------------------------------------------------------------------------
def run_levers(a, cfg: dict, chosen: list[Variant], clock: Clock, result: dict, save) -> None:
    import mlx.core as mx

    from bench.update import synthetic_stepper
    from trainer.config import TrainConfig
    from trainer.data.dataset import SyntheticStream
    from trainer.optim import make_optimizer
    from trainer.step import Stepper

    model, opt, _ = synthetic_stepper(
        depth=cfg["depth"],
        width=cfg["width"],
        heads=cfg["heads"],
        vocab=cfg["vocab"],
        seq_len=cfg["seq_len"],
        precision=a.precision,
    )
    B, T = cfg["local_batch"], cfg["seq_len"]
    stream = SyntheticStream(cfg["vocab"], T, 0)
    steppers: dict[str, Stepper] = {}
    figures = result.setdefault("variants", {})
    for v in chosen:
        o = opt
        if v.stepper.get("optimizer_step") == "flat":  # it packs its optimizer's state: its own
            o = make_optimizer(TrainConfig(synthetic=True))
            o.init(model.trainable_parameters())
        # Issue 12's update unless the variant says otherwise: the per-tensor step (the
        # Stepper's auto would pack the shared optimizer's state on a GPU).
        kw = {"optimizer_step": "per-tensor", **v.stepper}
        if "overlap" in inspect.signature(Stepper).parameters:
            kw = {"overlap": "off", **kw}  # issue 12's update had none
        cls = repacking_stepper() if v.repack else Stepper
        s = cls(model, o, precision=a.precision, pad_id=-1, grad_clip=1.0, **kw)
        s.twin.set_attention(v.attention, v.packed)
        steppers[v.name] = s
        figures[v.name] = {**asdict(v), "rounds": []}
    worker = TorchWorker(a, cfg) if a.torch and torch_available() else None
    result["torch"] = {"rounds": [], "error": None if worker else "torch not run (absent or off)"}
    counter = [0]
    keyed = "ahead" in inspect.signature(Stepper.update).parameters  # a tree with --overlap

    def run(name: str, n: int) -> dict:
        s = steppers[name]
        ups = []
        for _ in range(n):
            i = counter[0]
            counter[0] += 1
            batch = [mx.array(stream.batch(i * B, B, 0, B))]
            # keyed and ahead as train()'s loop (used with --overlap: update i + 1's first
            # microstep started behind update i's step; a round's first update builds its own)
            ahead = lambda i=i: (i + 1, mx.array(stream.batch((i + 1) * B, B, 0, B)))  # noqa: E731
            extra = {"key": i, "ahead": ahead} if keyed else {}
            ups.append(s.update(batch, 1e-4, **extra))  # resets the peak at its start
        peak = mx.get_peak_memory()
        med = statistics.median(u.update_s for u in ups)
        return {
            "tokens_per_s": B * T / med,
            "update_ms": 1e3 * med,
            "update_ms_all": [1e3 * u.update_s for u in ups],
            "compute_ms": 1e3 * statistics.median(u.compute_s for u in ups),
            "optimizer_ms": 1e3 * statistics.median(u.optimizer_s for u in ups),
            "peak_bytes": peak,
            "active_bytes": mx.get_active_memory(),
            "loss": ups[-1].loss,
        }

    log("levers: compiling round (not counted)")
    # What the timed rounds need once everything is compiled, about: kept free of compiling.
    timed_s = a.rounds * len(chosen) * (a.updates + 1) * (0.1 if a.device == "gpu" else 2.0)
    for v in chosen:
        if clock.left() < a.reserve_s + timed_s + a.profile_s:
            figures[v.name]["error"] = "skipped: no time left to compile it (deadline)"
            continue
        t0 = time.monotonic()
        try:
            run(v.name, a.warmup)
            figures[v.name]["compile_s"] = time.monotonic() - t0
            log(f"  {v.name}: {figures[v.name]['compile_s']:.1f} s")
        except Exception as e:  # a kernel that fails here drops its variant, not the run
            figures[v.name]["error"] = f"{type(e).__name__}: {e}"[:2000]
            log(f"  {v.name}: {figures[v.name]['error'][:200]}")
    live = [v.name for v in chosen if "error" not in figures[v.name]]
    save()
    if worker is not None:
        log("levers: waiting for torch.compile's warmup")
        wait = max(5.0, clock.left() - a.reserve_s - timed_s - a.profile_s)
        if not worker.wait_ready(wait):  # our rounds go on without it
            result["torch"]["error"] = worker.error
        result["torch"]["ready"] = worker.ready
    per_round = (a.updates + 1) * 0.1 * len(live)  # a rough floor; the first round tells
    for r in range(a.rounds):
        if clock.left() < a.reserve_s + per_round:
            result["cut"] = f"round {r + 1} of {a.rounds} not started (deadline)"
            break
        t0 = time.monotonic()
        order = live if r % 2 == 0 else live[::-1]  # interleaved, turned each round
        for name in order:
            figures[name]["rounds"].append(run(name, a.updates))
        if worker is not None:
            got = worker.round(timeout=max(30.0, clock.left() - a.reserve_s))
            if got is None:
                result["torch"]["error"] = worker.error
            else:
                result["torch"]["rounds"].append(got)
        per_round = time.monotonic() - t0
        log(f"levers: round {r + 1} done in {per_round:.1f} s")
        save()
    if worker is not None:
        worker.close()
    summarize_levers(result)
    save()
    steppers.clear()
    mx.clear_cache()


def summarize_levers(result: dict) -> None:
    """Each variant over the product, round by round (the same round: an interleaved pair),
    and ours over torch.compile in each round."""
    figures = result.get("variants", {})
    base = figures.get("product", {}).get("rounds", [])
    torch_rounds = result.get("torch", {}).get("rounds", [])
    for f in figures.values():
        rounds = f.get("rounds", [])
        f["tokens_per_s_median"] = (
            statistics.median(x["tokens_per_s"] for x in rounds) if rounds else None
        )
        f["over_product"] = [
            x["tokens_per_s"] / b["tokens_per_s"] for x, b in zip(rounds, base, strict=False)
        ]
        f["over_product_median"] = (
            statistics.median(f["over_product"]) if f["over_product"] else None
        )
        f["peak_minus_product_bytes"] = [
            x["peak_bytes"] - b["peak_bytes"] for x, b in zip(rounds, base, strict=False)
        ]
        f["over_torch_compile"] = [
            x["tokens_per_s"] / t["tokens_per_s"]
            for x, t in zip(rounds, torch_rounds, strict=False)
        ]


# --- profile ----------------------------------------------------------------------------------
def timed(fn, reps: int) -> float:
    fn()  # compile and warm up
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def run_profile(a, cfg: dict, kernel_ok: bool, clock: Clock, result: dict, save) -> None:
    import mlx.core as mx
    from mlx.utils import tree_map

    from bench.update import synthetic_stepper
    from trainer.model import kernels
    from trainer.model.loss import head_loss

    B, T, C, V = cfg["local_batch"], cfg["seq_len"], cfg["width"], cfg["vocab"]
    H = cfg["heads"]
    D = C // H
    dt = mx.float32 if a.precision == "fp32" else mx.bfloat16
    model, opt, stepper = synthetic_stepper(
        depth=cfg["depth"], width=C, heads=H, vocab=V, seq_len=T, precision=a.precision
    )
    pieces = result.setdefault("pieces", {})
    paths = [p for p in kernels.PATHS if kernel_ok or not p.startswith("fused")]

    def piece(name: str, make) -> None:
        if clock.left() < a.reserve_s:
            pieces[name] = {"skipped": "deadline"}
            return
        try:
            pieces[name] = {"ms": timed(make(), a.reps)}
        except Exception as e:
            pieces[name] = {"error": f"{type(e).__name__}: {e}"[:1000]}
        log(f"profile: {name} {pieces[name]}")
        save()

    keys = mx.random.split(mx.random.key(0), 6)
    rows = [mx.random.normal((B, T, H, D), key=keys[i]).astype(dt) for i in range(3)]
    cot = [mx.random.normal((B, T, H, D), key=keys[3 + i]).astype(dt) for i in range(3)]
    cot_tm = [c.transpose(0, 2, 1, 3) for c in cot]  # token-major memory, as SDPA's grads
    mx.eval(rows, cot)

    def qk(path):
        f = kernels.PATHS[path]
        g = mx.compile(
            lambda q, k, cq, ck: mx.vjp(
                lambda q, k: f(q, k, eps=1e-5, base=10000.0), [q, k], [cq, ck]
            )
        )
        return lambda: mx.eval(g(rows[0], rows[1], cot_tm[0], cot_tm[1]))

    for p in paths:
        piece(f"qk_norm_rope.{p}", lambda p=p: qk(p))

    def sdpa(token_major: bool):
        def f(q, k, v):
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask="causal")

        qkv = [x.transpose(0, 2, 1, 3) for x in rows]
        if not token_major:
            qkv = [mx.contiguous(x) for x in qkv]
            mx.eval(qkv)
        g = mx.compile(lambda q, k, v, c: mx.vjp(f, [q, k, v], [c]))
        c = cot_tm[2] if token_major else mx.contiguous(cot_tm[2])
        return lambda: mx.eval(g(*qkv, c))

    piece("sdpa.heads-first", lambda: sdpa(False))
    piece("sdpa.token-major", lambda: sdpa(True))

    x = (mx.random.normal((B, T, C), key=keys[0]) * 0.1).astype(dt)
    block = model.blocks[0]
    block.set_dtype(dt)

    def fb(module, path, packed=False):
        block.attn.path, block.attn.packed = path, packed

        def loss(params, x):
            module.update(params)
            return module(x).astype(mx.float32).sum()

        g = mx.compile(mx.value_and_grad(loss))
        params = module.trainable_parameters()

        def go():
            mx.eval(g(params, x))
            module.update(params)  # tracing left traced arrays in the module

        return go

    for p in paths:
        piece(f"attention.{p}", lambda p=p: fb(block.attn, p))
    best = "fused" if kernel_ok else "strided"
    piece(f"attention.{best}-qkv", lambda: fb(block.attn, best, packed=True))
    for p in ("plain", best):
        piece(f"block.{p}", lambda p=p: fb(block, p))
    piece(f"block.{best}-qkv", lambda: fb(block, best, packed=True))
    block.attn.path, block.attn.packed = "plain", False

    targets = mx.arange(B * T) % V
    mask = mx.ones(targets.shape, dtype=mx.float32)
    head_w = {"weight": model.lm_head.weight.astype(dt)}

    def head(**kw):
        def f(w, x):
            return head_loss(x.reshape(-1, C), w["weight"], targets, mask, **kw)

        g = mx.compile(mx.value_and_grad(f, argnums=(0, 1)))
        return lambda: mx.eval(g(head_w, x))

    if "fused" in inspect.signature(head_loss).parameters:  # issue 20's fused head
        piece("head.plain", lambda: head(fused=False))
        piece("head.default", lambda: head())
    else:
        piece("head.whole", lambda: head(chunk=0))
        piece(f"head.chunk-{a.loss_chunk}", lambda: head(chunk=a.loss_chunk))

    # Random, not mx.full: a constant is stored as one broadcast element, and AdamW's moments
    # made from it stay one element too, so the per-tensor step would skip their passes.
    key = mx.random.key(1)
    grads = tree_map(
        lambda p: 1e-3 * mx.random.normal(p.shape, dtype=mx.float32, key=key), model.parameters()
    )
    ntok = mx.array(float(B * T))
    mx.eval(grads)

    def step(stepper=stepper, model=model, opt=opt):
        def go():
            norm = stepper.apply(grads, ntok, 1e-4)
            mx.eval(model.parameters(), opt.state, norm)

        return go

    piece("optimizer.per-tensor", step)
    if flat_variant():  # lever 2, on a model and optimizer of its own (it packs their state)
        flat = synthetic_stepper(
            depth=cfg["depth"], width=C, heads=H, vocab=V, seq_len=T, precision=a.precision,
            optimizer_step="flat",
        )  # fmt: skip
        piece("optimizer.flat", lambda: step(flat[2], flat[0], flat[1]))


# --- the report -------------------------------------------------------------------------------
def report(result: dict) -> str:
    GiB = 2**30
    out = [f"issue 23 on {result.get('device')} (mlx {result.get('mlx')}), {result.get('config')}"]
    chk = result.get("check", {})
    out.append(
        f"\ncheck: ok={chk.get('ok')} backend={chk.get('backend')} ({chk.get('seconds', 0):.0f} s)"
    )
    for c in chk.get("cases", []):
        errs = c.get("errors") or {}
        worst = max(errs.values()) if errs else None
        out.append(
            f"  {c['shape']} {c['dtype']} offset {c['offset']} heads_first {c['heads_first']}"
            f" packed {c.get('packed')}: "
            f"{'ok' if c['ok'] else 'FAIL'} worst {worst} {c.get('error', '')[:300]}"
        )
    if "model" in chk:
        out.append(f"  model: {chk['model']}")
    lev = result.get("levers", {})
    figs = lev.get("variants", {})
    if figs:
        out.append(
            "\nlevers (median tokens/s; peak; optimizer ms; then per round: x the product in"
            " the same round | x torch.compile in the same round):"
        )
        for name, f in figs.items():
            if f.get("error"):
                out.append(f"  {name:<18} {f['error'][:200]}")
                continue
            rounds = f.get("rounds", [])
            if not rounds:
                continue
            ratios = " ".join(f"{r:.3f}" for r in f.get("over_product", []))
            if f.get("over_product_median"):
                ratios += f" (median {f['over_product_median']:.3f})"
            torch_r = " ".join(f"{r:.2f}" for r in f.get("over_torch_compile", []))
            peak = max(x["peak_bytes"] for x in rounds) / GiB
            opt = statistics.median(x["optimizer_ms"] for x in rounds)
            out.append(
                f"  {name:<18}{f['tokens_per_s_median']:>10,.0f} tok/s {peak:>7.2f} GiB"
                f" {opt:>7.2f} ms  x {ratios} | {torch_r}"
            )
    tr = lev.get("torch", {})
    if tr.get("rounds"):
        toks = ", ".join(f"{t['tokens_per_s']:,.0f}" for t in tr["rounds"])
        peak = max(t.get("peak_bytes") or 0 for t in tr["rounds"]) / GiB
        out.append(f"  torch.compile: {toks} tokens/s; peak {peak:.2f} GiB")
    if tr.get("error"):
        out.append(f"  torch.compile: {tr['error'][:500]}")
    if lev.get("cut"):
        out.append(f"  cut: {lev['cut']}")
    pieces = result.get("profile", {}).get("pieces", {})
    if pieces:
        out.append("\nprofile (forward + backward unless said; median ms):")
        for name, p in pieces.items():
            val = f"{p['ms']:.3f}" if "ms" in p else p.get("error", p.get("skipped", ""))[:200]
            out.append(f"  {name:<28}{val:>10}")
    out.append(f"\nelapsed {result.get('elapsed_s', 0):.0f} s; errors: {result.get('errors', [])}")
    return "\n".join(out)


# --- main -------------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", nargs="?", default="all", choices=("all", "check", "report"))
    p.add_argument("path", nargs="?", help="report: the JSON to print")
    p.add_argument("--out", default="/tmp/fleet-gpu-speed", help="folder for JSON and log")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: checks the script")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--deadline-s", type=float, default=520.0, help="stop starting work after")
    p.add_argument("--reserve-s", type=float, default=20.0, help="kept for writing up")
    p.add_argument(
        "--profile-s", type=float, default=90.0, help="kept for the profile while compiling levers"
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (pairs)")
    p.add_argument("--updates", type=int, default=None, help="timed updates a run (20; tiny 3)")
    p.add_argument("--warmup", type=int, default=None, help="compiling updates (3; tiny 2)")
    p.add_argument("--torch-warmup", type=int, default=5, help="torch.compile's warmup updates")
    p.add_argument("--reps", type=int, default=None, help="profile repetitions (10; tiny 3)")
    p.add_argument("--loss-chunk", type=int, default=None, help="head chunk (4096; tiny 64)")
    p.add_argument("--no-torch", dest="torch", action="store_false", help="skip torch.compile")
    p.add_argument("--sections", default="check,levers,profile", help="comma-separated")
    p.add_argument("--precision", default="mixed", choices=("fp32", "bf16", "mixed"))
    p.add_argument(
        "--variants", default="", help="levers: comma-separated names (default: all; product first)"
    )
    for name in FULL:
        flag = "--" + name.replace("_", "-")
        p.add_argument(
            flag, type=int, default=None, help=f"model size ({FULL[name]}; tiny {TINY[name]})"
        )
    a = p.parse_args(argv)
    tiny = a.tiny
    a.updates = a.updates or (3 if tiny else 20)
    a.warmup = a.warmup or (2 if tiny else 3)
    a.reps = a.reps or (3 if tiny else 10)
    a.loss_chunk = a.loss_chunk or (64 if tiny else 4096)
    if tiny:
        a.torch_warmup = min(a.torch_warmup, 2)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.command == "report":
        print(report(json.loads(Path(a.path).read_text())))
        return 0
    if a.command == "check":
        check_main(a)
        return 0
    from trainer import cuda_graphs, run_ahead

    graphs = cuda_graphs.apply("auto")  # as the trainer: before MLX's first kernel
    ahead = run_ahead.apply()
    import mlx.core as mx

    from trainer.model import kernels

    mx.set_default_device(mx.cpu if a.device == "cpu" else mx.gpu)
    clock = Clock(a.deadline_s)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(TINY if a.tiny else FULL)
    cfg.update({k: getattr(a, k) for k in FULL if getattr(a, k) is not None})
    result: dict = {
        "config": {**cfg, "precision": a.precision, "accum": 1},
        "args": {k: v for k, v in vars(a).items() if k != "path"},
        "device": str(mx.default_device()),
        "gpu_backend": kernels.gpu_backend(),
        "mlx": mx.__version__,
        "cuda_graphs": graphs,
        "run_ahead": ahead,
        "errors": [],
    }

    def save() -> None:
        result["elapsed_s"] = clock.elapsed()
        tmp = out / "gpu-speed.json.tmp"
        tmp.write_text(json.dumps(result, indent=1, default=str))
        tmp.replace(out / "gpu-speed.json")

    sections = a.sections.split(",")
    kernel_ok = True
    if "check" in sections:
        log("check: the kernel against the plain path (child process)")
        result["check"] = run_check(a, clock)
        kernel_ok = bool(result["check"].get("ok"))
        log(f"check: ok={kernel_ok}")
        save()
    every = variants(a.loss_chunk)
    wanted = [v for v in every if not a.variants or v.name in a.variants.split(",")]
    chosen = [v for v in wanted if kernel_ok or not v.needs_kernel]
    result["dropped"] = [v.name for v in wanted if v not in chosen]
    for name, fn in (
        ("levers", lambda r: run_levers(a, cfg, chosen, clock, r, save)),
        ("profile", lambda r: run_profile(a, cfg, kernel_ok, clock, r, save)),
    ):
        if name not in sections:
            continue
        if clock.left() < a.reserve_s:
            result["errors"].append(f"{name}: not started (deadline)")
            continue
        log(f"{name}: start")
        result[name] = {}
        try:
            fn(result[name])
        except Exception as e:  # record and go on to the next section
            result["errors"].append(f"{name}: {type(e).__name__}: {e}"[:2000])
            log(result["errors"][-1])
        save()
    text = report(result)
    (out / "gpu-speed.log").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
