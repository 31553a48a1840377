"""The trainer's subcommands: `fleet prepare`, `train`, `launch`, `export` and `sample`.

Nothing here imports mlx at module level, so `fleet prepare` and `--help` start fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.model.trained import Trained


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "prepare":
        from trainer.data.prepare import add_arguments

        add_arguments(parser)
    elif name == "train":
        from trainer.config import add_arguments

        parser.description = (
            "Train a GPT on this machine, or as one rank of a run started by `fleet launch` "
            "or `mlx.launch`. Flags, a --config TOML file and a resumed checkpoint share the "
            "same keys; explicit flags win."
        )
        add_arguments(parser)
    elif name == "launch":
        from trainer.launch.launcher import add_arguments

        add_arguments(parser)
    elif name == "check":
        from trainer.launch.check import add_arguments

        add_arguments(parser)
    elif name == "export":
        export_arguments(parser)
    elif name == "sample":
        sample_arguments(parser)


def run(name: str, args: argparse.Namespace) -> int:
    if name == "prepare":
        from trainer.data.prepare import main

        return main(args)
    if name == "train":
        return train_command(args)
    if name == "launch":
        from trainer.launch.launcher import main

        return main(args)
    if name == "check":
        if args.probe_rank:  # one rank of the check's probe, started by mlx.launch
            from trainer.probe import probe_rank

            return probe_rank(args.probe_rank)
        from trainer.launch.check import main

        return main(args)
    if name in ("export", "sample"):
        return trained_command(name, args)
    raise ValueError(name)


def train_command(args: argparse.Namespace) -> int:
    """Resolve the config (defaults < checkpoint < --config < flags), then run the loop."""
    from telemetry.errors import TelemetryError
    from trainer import lock
    from trainer.checkpoint import catalog
    from trainer.config import FIELDS, ConfigError, explicit, from_args
    from trainer.data.dataset import DatasetError
    from trainer.data.tokenizer import TokenizerError
    from trainer.distributed import Cluster, WrongGroup
    from trainer.launch.restart import restart_record
    from trainer.train import train as loop

    try:
        cluster = Cluster()
    except RuntimeError as e:  # e.g. the ring backend cannot bind or reach its peers
        rank = os.environ.get("MLX_RANK", "?")
        hint = "" if isinstance(e, WrongGroup) else " (a port in use? try another --starting-port)"
        print(
            f"fleet train: rank {rank}: cannot join the distributed group: {e}{hint}",
            file=sys.stderr,
            flush=True,
        )
        return 3
    who = f"fleet train: rank {cluster.rank}" if cluster.size > 1 else "fleet train"
    try:
        given = explicit(args)
        run_dir = given.get("run_dir") or FIELDS["run_dir"].default
        try:
            # One writer per run folder per host, before anything in it is read or moved.
            lock.hold(run_dir, cluster.rank, cluster.size, cluster.all_sum_floats)
            resume_path, base = None, None
            which = given.get("resume", "")
            if which:
                resume_path, manifest, warnings = catalog.resolve(run_dir, which)
                for w in warnings:
                    print(f"{who}: warning: {w}", file=sys.stderr, flush=True)
                if manifest.get("replicas_agree") is False:
                    if not given.get("resume_disagreeing"):
                        raise ConfigError(
                            f"{resume_path}: its ranks' weights disagreed when it was saved "
                            "(replicas_agree: false); resume an earlier checkpoint, or pass "
                            "--resume-disagreeing to use it anyway"
                        )
                    print(
                        f"{who}: warning: resuming {resume_path}, whose replicas disagreed",
                        file=sys.stderr,
                    )
                base = catalog.read_json(resume_path, catalog.CONFIG)
                # A resumed run keeps the checkpoint's settings, except how this session ends.
                session = ("stop_at", "resume_disagreeing", "overwrite")
                base = {k: v for k, v in base.items() if k in FIELDS and k not in session}
                if "seed" in given and given["seed"] != base.get("seed", given["seed"]):
                    raise ConfigError(
                        f"--seed {given['seed']} differs from the run's seed {base['seed']}: it "
                        "would re-order the samples mid-epoch (some seen twice, some never); "
                        "drop --seed to resume, or start a new --run-dir"
                    )
            cfg = from_args(args, base)
            if which and cfg.overwrite:
                raise ConfigError(
                    "--overwrite starts a new run, --resume continues the one in --run-dir: "
                    "give one of them"
                )
            # A new run takes a folder without a run in it; a relaunch by `fleet launch
            # --restarts` that had nothing to resume from goes on in its own folder.
            fresh = not which and restart_record() is None
            if fresh and (why := claim_run_folder(cfg.run_dir, cfg.overwrite, cluster, who)):
                if why.text:  # one rank speaks for the ranks that share its folder
                    print(f"{who}: error: {why.text}", file=sys.stderr, flush=True)
                return 2
            if base is not None and cluster.is_root:
                note = schedule_note(base, cfg, given, resume_path)
                if note:
                    print(f"{who}: note: {note}", flush=True)
            return cluster.finish(loop(cfg, cluster, resume_path, frozenset(given)))
        finally:
            lock.release(run_dir)
    except (
        ConfigError,
        catalog.CheckpointError,
        DatasetError,
        TokenizerError,
        TelemetryError,
    ) as e:
        print(f"{who}: error: {e}", file=sys.stderr, flush=True)
        return 2


@dataclass
class Refusal:
    """A new run refused its folder; `text` is "" on the ranks that leave the telling to
    another (rank 0, or the first rank of another host)."""

    text: str


def claim_run_folder(run_dir: str, overwrite: bool, cluster, who: str) -> Refusal | None:
    """A new run takes a folder that holds no run: refuse one that does (every rank looks at
    its own host's folder, and all refuse together), or with --overwrite move the old run
    aside first. Two tiny all-reduces: no rank writes into its folder before every host's
    old run is out of the way."""
    from telemetry import rundir
    from trainer import lock

    held = rundir.held(run_dir)
    holding = [0.0] * cluster.size
    holding[cluster.rank] = 1.0 if held else 0.0
    holding = cluster.all_sum_floats(holding)
    if not any(holding):
        return None
    if not overwrite:
        # Rank 0 says it for every rank of its host; a rank of another host says it only
        # when rank 0's folder is free (the same words from N ranks help nobody).
        speaks = held and (cluster.is_root or not holding[0])
        return Refusal(rundir.refusal(run_dir, held) if speaks else "")
    if held and (moved := rundir.move_aside(run_dir)) is not None:
        print(f"{who}: --overwrite: moved the run in {run_dir} to {moved}", flush=True)
    cluster.barrier()
    # The lock went aside with the old run: its holder locks the new folder (no other
    # process could take it meanwhile: the folder did not exist).
    if not lock.intact(run_dir) and (why := lock.retake(run_dir)):
        return Refusal(why)
    return None


# --- `fleet export` and `fleet sample`: a trained checkpoint, used -------------------------
def _target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="CKPT|RUN",
        help="a checkpoint folder (RUN/checkpoints/step-NNNNNN) or a run folder (the --run-dir "
        "of `fleet train`), whose checkpoint --latest or --best is used",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--latest",
        action="store_true",
        help="the run's newest checkpoint that verifies (the default for a run folder)",
    )
    which.add_argument(
        "--best",
        action="store_true",
        help="the run's checkpoint of the lowest val loss (kept by runs with --eval-every)",
    )
    parser.add_argument(
        "--tokenizer",
        default="",
        metavar="PATH",
        help="the tokenizer.json the model was trained with, checked against the checkpoint "
        "(default: the one its dataset folder names; the byte tokenizer needs no file)",
    )


def export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a checkpoint as an mlx-lm model folder (mlx-lm's own `nanochat` model type): "
        "config.json, model.safetensors, the tokenizer files and origin.json (the checkpoint's "
        "identity). Load it with mlx_lm.load(DIR), or run `mlx_lm.generate --model DIR` "
        "(pip install 'mlx-fleet[export]')."
    )
    _target_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=("fp32", "bf16"),
        help="weights' dtype: fp32 gives mlx-lm the logits of our model; bf16 half the size "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace --out if it holds an earlier export"
    )


def sample_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Generate text from a checkpoint, printed as it comes (a KV cache: each token costs "
        "one position, not the whole prefix again). Stops after --tokens or at end of text."
    )
    _target_arguments(parser)
    parser.add_argument(
        "--prompt",
        default=None,
        metavar="TEXT",
        help="text to continue; '' starts a new document (default: the run's --prompt)",
    )
    # mlx-lm's names too (mlx_lm.generate --max-tokens --temp): one habit serves both tools
    parser.add_argument(
        "--tokens",
        "--max-tokens",
        dest="tokens",
        type=int,
        default=200,
        metavar="N",
        help="most tokens to generate (default: %(default)s)",
    )
    parser.add_argument(
        "--temperature",
        "--temp",
        dest="temperature",
        type=float,
        default=0.8,
        metavar="T",
        help="sampling temperature; 0 = always the most likely token (default: %(default)s)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=0,
        metavar="K",
        help="sample among the K most likely tokens (0 = all) (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="sampling seed (default: %(default)s)"
    )


def trained_command(name: str, args: argparse.Namespace) -> int:
    """`fleet export` or `fleet sample`: find the checkpoint, then write or generate."""
    from trainer.checkpoint.catalog import CheckpointError
    from trainer.data.dataset_format import DatasetError
    from trainer.data.tokenizer import TokenizerError
    from trainer.model import trained
    from trainer.model.export import ExportError

    if getattr(args, "tokens", 0) < 0:
        print(f"fleet {name}: error: --tokens {args.tokens}: give 0 or more", file=sys.stderr)
        return 2
    try:
        model = trained.find(args.target, best=args.best)
        for w in model.warnings:
            print(f"fleet {name}: warning: {w}", file=sys.stderr, flush=True)
        return export_model(model, args) if name == "export" else sample(model, args)
    except (CheckpointError, DatasetError, ExportError, TokenizerError) as e:
        # One line: the reason and what to do. (CheckpointError and friends say both.)
        print(f"fleet {name}: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return 2


def export_model(model: Trained, args: argparse.Namespace) -> int:
    from trainer.model.export import export

    out = export(
        model, args.out, dtype=args.dtype, force=args.force, tokenizer=args.tokenizer or None
    )
    print(
        f"fleet export: {out} from {model.path} (update {model.step}, {args.dtype}); "
        f"try: mlx_lm.generate --model {out} --prompt 'def '"
    )
    return 0


def sample(model: Trained, args: argparse.Namespace) -> int:
    from trainer.model.generate import stream

    tokenizer, gpt = model.tokenizer(args.tokenizer or None), model.model()
    prompt = args.prompt if args.prompt is not None else model.train_config().get("prompt", "")
    print(f"fleet sample: {model.path} (update {model.step})", file=sys.stderr, flush=True)

    def write(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()  # a piece per token: the reader sees the text as it comes

    stream(
        gpt,
        tokenizer,
        prompt,
        args.tokens,
        write,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
    )
    write("\n")
    return 0


SCHEDULE_KEYS = ("updates", "lr", "warmup", "decay", "min_lr_ratio")  # what shapes the rate


def schedule_note(base: dict, cfg, given: dict, resume_path) -> str:
    """One line when a resume's flags reshape the learning-rate schedule, else "".

    `--resume latest --updates 40` on a run planned for 30 stretches the schedule: the rate
    at the checkpoint jumps (2.05e-4 -> 4.90e-4 on the README's tour). Say so, with both.
    """
    from trainer.checkpoint import catalog
    from trainer.config import TrainConfig
    from trainer.optim import Schedule

    changed = [k for k in SCHEDULE_KEYS if k in given and given[k] != base.get(k, given[k])]
    if not changed:
        return ""
    old = TrainConfig(**base)
    state = catalog.read_json(resume_path, catalog.STATE)
    manifest = catalog.read_json(resume_path, catalog.MANIFEST)
    step, tokens = int(state.get("step", 0)), int(state.get("tokens", 0))
    try:  # the run's planned tokens per update, as the loop computes them
        batch = manifest["global_batch"]
        per_update = batch["microbatch"] * batch["accum"] * manifest["architecture"]["seq_len"]
    except (KeyError, TypeError):
        per_update = tokens // max(1, step)
    was = Schedule.from_config(old, per_update)(tokens)
    now = Schedule.from_config(cfg, per_update)(tokens)
    flags = ", ".join(f"--{k.replace('_', '-')} {given[k]} (was {base.get(k)})" for k in changed)
    if changed == ["updates"]:
        how = f"the learning-rate schedule is stretched to {cfg.updates} updates"
        if cfg.updates < old.updates:
            how = f"the learning-rate schedule is shortened to {cfg.updates} updates"
    else:
        how = "the learning-rate schedule changes"
    return f"{flags}: {how}; at update {step} the rate goes from {was:.2e} to {now:.2e}"
