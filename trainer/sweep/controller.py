"""The sweep's controller: one process that asks Optuna for trials, runs each as a real
`fleet launch` run, feeds its evaluations back, prunes, re-runs the best on new seeds, and
crowns the champion. The only writer of the study's SQLite storage.

Unattended for days: every decision is written to the study before it is acted on, and a
trial's facts are read back from its run folder, never kept in memory only. So `--resume`
after a crash or a reboot ends what the dead controller left running, restarts each trial
that was running from its newest usable checkpoint, keeps every finished one, and goes on.
A trial that fails is recorded with its reason and the sweep goes on; SIGTERM, SIGINT or
SIGHUP stop the running trials with a checkpoint, and then the sweep.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry import ports
from telemetry.files import atomic_write
from trainer.sweep import champion, layout, metric, plan, pruning
from trainer.sweep.spec import Spec, SpecError, load
from trainer.sweep.trial import TrialProcess, end_orphan, resume_point

POLL_S = 1.0


class SweepError(RuntimeError):
    """A sweep that cannot start or go on; one line."""


def need_optuna():
    try:
        import optuna
    except ImportError:
        raise SweepError(
            "fleet sweep needs Optuna: pip install 'mlx-fleet[sweep]' (the `sweep` extra)"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_study(spec: Spec, folder: Path):
    """The sweep's study in SWEEP/study.db (created, or loaded as it was left)."""
    optuna = need_optuna()
    sampler = _sampler(spec, optuna)
    return optuna.create_study(
        storage=layout.at(folder).storage_url,
        study_name="sweep",
        direction=spec.direction,
        sampler=sampler,
        pruner=pruning.make_pruner(spec.rule, spec.warmup, spec.min_trials, spec.reduction),
        load_if_exists=True,
    )


def _sampler(spec: Spec, optuna):
    if spec.sampler == "grid":

        class Grid(optuna.samplers.GridSampler):
            # GridSampler stops `optimize` when the grid is covered (study.stop); ask-and-tell
            # has no optimize loop to stop: the controller counts trials itself.
            def after_trial(self, study, trial, state, values) -> None:
                pass

        return Grid(spec.grid(), seed=spec.sampler_seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=spec.sampler_seed)
    return optuna.samplers.TPESampler(seed=spec.sampler_seed, n_startup_trials=spec.startup_trials)


def distributions(spec: Spec) -> dict[str, Any]:
    """Optuna's distribution of each searched flag."""
    d = need_optuna().distributions
    out = {}
    for p in spec.params:
        if p.kind == "values":
            out[p.name] = d.CategoricalDistribution(list(p.values))
        elif p.kind == "int":
            out[p.name] = d.IntDistribution(int(p.low), int(p.high), log=p.log)
        else:
            out[p.name] = d.FloatDistribution(p.low, p.high, log=p.log)
    return out


def records(study) -> list[champion.Record]:
    """Every trial of the study as the champion and the reports see it."""
    out = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        out.append(
            champion.Record(
                number=t.number,
                params=dict(t.params),
                seed=int(a.get("seed", 0)),
                state=t.state.name,
                value=t.value if t.state.name == "COMPLETE" else None,
                role=a.get("role", champion.SEARCH),
                of=a.get("of"),
                diverged=bool(a.get("diverged")),
            )
        )
    return out


@dataclass
class Running:
    """A trial in a slot of the fleet."""

    trial: Any  # optuna.trial.Trial
    process: TrialProcess
    run_dir: Path
    trial_plan: plan.TrialPlan
    role: str
    reported: set[int] = field(default_factory=set)  # Optuna steps (thousandths) told
    pruning: str = ""  # why, once it is being stopped for it
    diverged: bool = False


class Controller:
    """Runs a sweep to its champion (or until a signal), from a fresh folder or a resumed one."""

    def __init__(
        self,
        spec: Spec,
        *,
        resume: bool = False,
        say: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
        argv_for: Callable[[Spec, list[str], str, int], list[str]] = plan.command,
    ) -> None:
        # Absolute: a trial is found again by its run folder in its command line.
        self.spec, self.folder = spec, Path(spec.folder).resolve()
        self.argv_for = argv_for  # (spec, train args, hostfile, port) -> the trial's argv
        self.dir = layout.at(self.folder)
        self.say = say or (lambda msg: print(msg, flush=True))
        self.env = dict(os.environ if env is None else env)
        self.signalled = 0
        self.slots: list[Running | None] = [None] * spec.fleet.concurrent
        self.study = self._open(resume)
        self.dists = distributions(spec)
        self.started = time.time()

    # --- the folder and the study ------------------------------------------------------
    def _open(self, resume: bool):
        spec, d = self.spec, self.dir
        if d.spec.exists():
            if not resume:
                raise SweepError(
                    f"{self.folder} holds a sweep already: `fleet sweep {spec.path} --resume` "
                    "goes on with it; or give another folder (--out)"
                )
            try:
                saved = load(d.spec, self.folder)
            except SpecError as e:
                raise SweepError(f"{d.spec}: {e}") from None
            if saved.digest != spec.digest:
                key = _first_difference(saved.raw, spec.raw)
                raise SweepError(
                    f"{self.folder} was made by another spec ({key} differs from {d.spec}): "
                    "resume it with the same spec, or start a new folder (--out)"
                )
        elif resume:
            raise SweepError(f"nothing to resume: {self.folder} holds no sweep")
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            # The spec first: a crash before the study exists leaves a folder --resume takes.
            atomic_write(d.spec, spec.path.read_bytes())
        study = open_study(spec, self.folder)
        if spec.baseline and not study.get_trials(deepcopy=False):
            study.enqueue_trial(spec.baseline, user_attrs={"baseline": True})
        self._split_hostfile()
        return study

    def _split_hostfile(self) -> None:
        """Disjoint parts of the hostfile, one per concurrent trial."""
        fleet = self.spec.fleet
        if not fleet.hostfile or fleet.concurrent == 1:
            return
        import json

        from trainer.launch.plan import read_hostfile

        hosts, backend = read_hostfile(fleet.hostfile)
        if len(hosts) % fleet.concurrent:
            raise SweepError(
                f"{fleet.hostfile} has {len(hosts)} hosts: not {fleet.concurrent} equal parts"
            )
        size = len(hosts) // fleet.concurrent
        for i in range(fleet.concurrent):
            part = {"hosts": hosts[i * size : (i + 1) * size]}
            if backend:
                part["backend"] = backend
            self.dir.part(i).parent.mkdir(parents=True, exist_ok=True)
            self.dir.part(i).write_text(json.dumps(part, indent=2) + "\n")

    # --- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.getsignal(s) for s in signums}
        for s in signums:
            signal.signal(s, self._on_signal)
        try:
            self._adopt()
            while True:
                layout.beat(self.folder, started=self.started)
                for i, slot in enumerate(self.slots):
                    if slot is not None:
                        self._watch(i, slot)
                if not self.signalled:
                    self._fill()
                if all(s is None for s in self.slots) and (self.signalled or not self._more()):
                    break
                time.sleep(POLL_S)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if self.signalled:
            name = signal.Signals(self.signalled).name
            self.say(
                f"fleet sweep: stopped on {name}; the running trials were checkpointed: "
                f"`fleet sweep {self.spec.path} --resume` goes on"
            )
            return 128 + self.signalled
        self._crowned()
        return 0

    def _on_signal(self, signum: int, frame) -> None:
        if self.signalled:  # again: end the trials now
            for slot in self.slots:
                if slot is not None:
                    slot.process.end_if_late(0)
            return
        self.signalled = signum
        self.say(f"fleet sweep: {signal.Signals(signum).name}: stopping the running trials")
        for slot in self.slots:
            if slot is not None:
                slot.process.stop()

    # --- starting trials ---------------------------------------------------------------
    def _counts(self) -> tuple[int, int]:
        """(search trials started, search trials still running or waiting)."""
        trials = self.study.get_trials(deepcopy=False)
        search = [t for t in trials if t.user_attrs.get("role", "search") == "search"]
        started = [t for t in search if t.state.name != "WAITING"]
        live = [t for t in search if t.state.name in ("RUNNING", "WAITING")]
        return len(started), len(live)

    def _more(self) -> bool:
        started, live = self._counts()
        if started < self.spec.trials or live:
            return True
        return bool(self._reruns())

    def _reruns(self) -> list[tuple[champion.Record, int]]:
        s = self.spec
        return champion.reruns_needed(records(self.study), s.top_k, s.seeds, s.minimize)

    def _fill(self) -> None:
        """Start a trial in each free slot: search trials first, then (once every search
        trial has ended) the re-runs of the best on new seeds."""
        for i, slot in enumerate(self.slots):
            if slot is not None:
                continue
            started, live = self._counts()
            if started < self.spec.trials:
                trial = self.study.ask(self.dists)
                trial.set_user_attr("role", champion.SEARCH)
                trial.set_user_attr("seed", self.spec.seed)
            elif live:
                return  # the top k is known only once every search trial has ended
            else:
                waiting = [
                    t for t in self.study.get_trials(deepcopy=False) if t.state.name == "WAITING"
                ]
                reruns = self._reruns()
                if not reruns and not waiting:
                    return
                if not waiting:
                    for top, seed in reruns:
                        self.study.enqueue_trial(
                            top.params, user_attrs={"role": champion.CONFIRM, "of": top.number,
                                                    "seed": seed},
                        )  # fmt: skip
                        self.say(f"trial {top.number}: re-run on seed {seed} queued")
                trial = self.study.ask(self.dists)
            self._start(i, trial, resume=False)

    def _start(self, index: int, trial, resume: bool) -> None:
        s, number = self.spec, trial.number
        attrs = trial.user_attrs if hasattr(trial, "user_attrs") else {}
        seed, role = int(attrs.get("seed", s.seed)), attrs.get("role", champion.SEARCH)
        run_dir = self.dir.trial(number)
        try:
            tp = plan.trial_plan(s, trial.params)
            plan.validate_values(s, trial.params)
        except (SpecError, ValueError) as e:
            self._tell_failed(trial, f"cannot run these values: {e}")
            return
        reported = set(self.study._storage.get_trial(trial._trial_id).intermediate_values)
        evaluated = set(metric.progress(run_dir).evals)
        point = resume_point(run_dir, tp.updates, evaluated) if resume else None
        if resume and point is None and run_dir.exists():
            # Nothing usable to resume from: start over in a fresh folder, keeping the old.
            run_dir.rename(run_dir.with_name(f"{run_dir.name}.restart-{int(time.time())}"))
        train = plan.train_args(s, trial.params, run_dir, seed, resume=False)
        if point is not None:
            train += ["--resume", str(point)]
        if "telemetry_port_base" not in s.train and not s.fleet.hostfile:
            train += ["--telemetry-port-base", str(ports.free_loopback_base(s.fleet.ranks))]
        hostfile = str(self.dir.part(index)) if s.fleet.hostfile and s.fleet.concurrent > 1 else (
            s.fleet.hostfile
        )  # fmt: skip
        port = s.fleet.starting_port or (
            ports.free_loopback_base(s.fleet.ranks + 1) if not hostfile else 32323
        )
        argv = self.argv_for(s, train, hostfile, port)
        env = dict(self.env)
        if not hostfile and "OPENBLAS_NUM_THREADS" not in env:
            # Trials side by side share this machine's cores.
            share = max(1, (os.cpu_count() or 1) // (s.fleet.concurrent * s.fleet.ranks))
            env["OPENBLAS_NUM_THREADS"] = str(share)
        process = TrialProcess(argv, self.dir.log(number), env)
        trial.set_user_attr("pid", process.pid)
        trial.set_user_attr("updates", tp.updates)
        trial.set_user_attr("eval_every", tp.eval_every)
        trial.set_user_attr("tokens_per_update", tp.tokens_per_update)
        self.slots[index] = Running(trial, process, run_dir, tp, role, reported)
        what = "re-run of trial " + str(attrs.get("of")) if role == champion.CONFIRM else "trial"
        how = f"resumed from {point.name}" if point is not None else "started"
        values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in trial.params.items())  # fmt: skip
        self.say(f"trial {number} ({what}, seed {seed}): {how}: {values}")

    def _adopt(self) -> None:
        """After a crash: end what the dead controller left running, record what it had
        decided, and restart each trial that was running from its newest usable checkpoint."""
        optuna = need_optuna()
        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        free = [i for i, s in enumerate(self.slots) if s is None]
        for frozen in running:
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            run_dir = self.dir.trial(frozen.number)
            if end_orphan(run_dir, self.spec.fleet.stop_grace + 10):
                self.say(f"trial {frozen.number}: ended the process the last controller left")
            if frozen.user_attrs.get("failed"):  # decided, not yet told
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if frozen.user_attrs.get("pruned"):
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            if not free:  # more running than slots (a smaller --concurrent): wait for a slot
                self.slots.append(None)
                free.append(len(self.slots) - 1)
            self._start(free.pop(0), trial, resume=True)

    # --- watching a trial ----------------------------------------------------------------
    def _watch(self, index: int, r: Running) -> None:
        progress = metric.progress(r.run_dir)
        if not r.pruning:
            why = pruning.diverging(progress.losses, self.spec.diverge)
            if why:
                r.diverged = True
                self._prune(r, why)
            else:
                self._report(r, progress)
        code = r.process.poll()
        if code is None:
            r.process.end_if_late(self.spec.fleet.stop_grace + 30)
            return
        progress = metric.progress(r.run_dir)  # what it logged last
        self._report(r, progress)
        elapsed = r.process.elapsed()
        t = r.trial
        t.set_user_attr("run_s", float(t.user_attrs.get("run_s", 0.0)) + elapsed)
        t.set_user_attr("tokens_per_s", progress.tokens_per_s)
        t.set_user_attr("peak_mem", progress.peak_mem)
        self.slots[index] = None
        self._ended(r, code, progress)

    def _report(self, r: Running, progress: metric.Progress) -> None:
        """Tell Optuna each new evaluation; prune (search trials, past the warm-up) as its
        pruner says."""
        if r.pruning:
            return
        for step in sorted(progress.evals):
            if step % r.trial_plan.eval_every or step > r.trial_plan.updates:
                continue
            at = pruning.step_of(r.trial_plan.fraction(step))
            if at in r.reported:
                continue
            val_loss, tokens = progress.evals[step]
            try:
                value = metric.to_metric(
                    self.spec.metric, val_loss, tokens, self.spec.train.get("data", ""),
                    int(self._value("eval_samples", r)),
                )  # fmt: skip
            except (metric.MetricError, OSError, ValueError) as e:
                self._prune(r, f"the metric cannot be computed: {e}", fail=True)
                return
            r.trial.report(value, at)
            r.reported.add(at)
            if not math.isfinite(value):
                r.diverged = True
                self._prune(r, f"the {self.spec.metric} is {value} at update {step}")
                return
            final = step == r.trial_plan.updates
            if r.role == champion.SEARCH and not final and r.trial.should_prune():
                frozen = self.study._storage.get_trial(r.trial._trial_id)
                why = pruning.explain(
                    self.spec.rule, value, at, self.study.get_trials(deepcopy=False),
                    frozen.number, self.spec.minimize, self.spec.reduction,
                )  # fmt: skip
                self._prune(r, f"{why} (update {step} of {r.trial_plan.updates})")
                return

    def _value(self, name: str, r: Running) -> Any:
        from trainer.config import FIELDS

        return r.trial.params.get(name, self.spec.train.get(name, FIELDS[name].default))

    def _prune(self, r: Running, why: str, fail: bool = False) -> None:
        """Decide first (in the study), then stop the trial with a checkpoint."""
        r.pruning = why
        key = "failed" if fail else "pruned"
        r.trial.set_user_attr(key, why)
        if r.diverged:
            r.trial.set_user_attr("diverged", True)
        self.say(f"trial {r.trial.number}: {key}: {why}")
        r.process.stop()

    def _ended(self, r: Running, code: int, progress: metric.Progress) -> None:
        optuna = need_optuna()
        state = optuna.trial.TrialState
        t, tp = r.trial, r.trial_plan
        if r.pruning:
            if t.user_attrs.get("failed"):
                self.study.tell(t, state=state.FAIL)
            else:
                self.study.tell(t, state=state.PRUNED)
            return
        if self.signalled:
            return  # stopped with the sweep: RUNNING in the study, resumed by --resume
        final = pruning.step_of(1.0) in r.reported
        if code == 0 and final:
            frozen = self.study._storage.get_trial(t._trial_id)
            value = frozen.intermediate_values[pruning.step_of(1.0)]
            t.set_user_attr("ended", "finished")
            self.study.tell(t, value)
            self.say(f"trial {t.number}: finished: {self.spec.metric} {value:.4f}")
            return
        why = pruning.diverging(progress.losses, 0.0)
        if why or "loss is" in progress.error and "nan" in progress.error.lower():
            t.set_user_attr("pruned", why or progress.error)
            t.set_user_attr("diverged", True)
            self.say(f"trial {t.number}: pruned: {why or progress.error}")
            self.study.tell(t, state=state.PRUNED)
            return
        if code == 0:
            reason = f"ended without the evaluation at update {tp.updates} (the budget's end)"
        else:
            reason = progress.error or f"exited with code {code}"
            tail = _tail(self.dir.log(t.number))
            if tail and not progress.error:
                reason += f": {tail}"
        t.set_user_attr("failed", reason)
        self.say(f"trial {t.number}: failed: {reason} (see {self.dir.log(t.number)})")
        self.study.tell(t, state=state.FAIL)

    def _tell_failed(self, trial, why: str) -> None:
        optuna = need_optuna()
        trial.set_user_attr("failed", why)
        self.say(f"trial {trial.number}: failed: {why}")
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _crowned(self) -> None:
        s = self.spec
        best, final = champion.crown(records(self.study), s.top_k, s.seeds, s.minimize)
        if best is None:
            self.say("fleet sweep: done; no trial finished, so there is no champion")
            return
        low, high, sd = best.spread
        self.say(
            f"fleet sweep: champion trial {best.number}: {s.metric} {best.mean:.4f} mean over "
            f"{len(best.values)} seed(s) {list(best.seeds)} (min {low:.4f}, max {high:.4f}, "
            f"sd {sd:.4f}){'' if final else ' (not every re-run finished)'}; "
            f"`fleet sweep promote {self.folder}` prints its command line"
        )


def _tail(log: Path, lines: int = 1) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:]).strip()[:300]


def _first_difference(a: dict, b: dict, prefix: str = "") -> str:
    for key in sorted(set(a) | set(b)):
        if key == "trials" and not prefix:
            continue
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            inner = _first_difference(x, y, f"{prefix}{key}.")
            if inner:
                return inner
        elif x != y:
            return f"{prefix}{key}"
    return ""


def main(spec_path: str, *, resume: bool, out: str | None, concurrent: int | None) -> int:
    """`fleet sweep SPEC` (SPEC may be a sweep folder when resuming)."""
    path = Path(spec_path)
    if path.is_dir():
        if not layout.at(path).spec.is_file():
            raise SweepError(f"{path} is not a sweep folder (no {layout.SPEC})")
        spec = load(layout.at(path).spec, out or path)
    else:
        spec = load(path, out)
    if concurrent:
        from dataclasses import replace

        spec = replace(spec, fleet=replace(spec.fleet, concurrent=concurrent))
    controller = Controller(spec, resume=resume)
    return controller.run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1], resume="--resume" in sys.argv, out=None, concurrent=None))
