"""A trained model as `fleet export` and `fleet sample` find it: a checkpoint, its
architecture, its weights and the tokenizer it was trained with.

A target is a checkpoint folder (it has a manifest.json) or a run folder, whose
`checkpoints/latest` (the default) or `checkpoints/best` link names the checkpoint.
Every refusal is a one-line error that says what to do instead.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from trainer.checkpoint import catalog
from trainer.checkpoint.catalog import CheckpointError
from trainer.data.dataset_format import DatasetError, read_meta
from trainer.data.tokenizer import Tokenizer, TokenizerError, identity_digest_part, load_tokenizer
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT


@dataclass
class Trained:
    """One verified checkpoint and what it says about the model in it."""

    path: Path
    manifest: dict[str, Any]
    cfg: ModelConfig
    warnings: list[str]

    @property
    def step(self) -> int:
        return int(self.manifest.get("step", 0))

    @property
    def val_loss(self) -> float | None:
        """The validation loss of these weights, if the run evaluated them (state.json keeps
        its evaluations: `evals` as [update, loss] pairs)."""
        step = self.manifest.get("step")
        found = [loss for at, loss in self.state().get("evals", []) if at == step]
        return float(found[-1]) if found else None

    def state(self) -> dict[str, Any]:
        return catalog.read_json(self.path, catalog.STATE)

    def train_config(self) -> dict[str, Any]:
        return catalog.read_json(self.path, catalog.CONFIG)

    def weights(self) -> dict[str, mx.array]:
        """The checkpoint's parameters by name, checked against the architecture's shapes."""
        have = mx.load(str(self.path / catalog.WEIGHTS))
        # GPT(cfg)'s parameters are lazy (never evaluated), so this allocates nothing.
        want = {k: tuple(v.shape) for k, v in tree_flatten(GPT(self.cfg).parameters())}
        got = {k: tuple(v.shape) for k, v in have.items()}
        if got != want:
            odd = sorted(set(got) ^ set(want)) or [k for k in want if got[k] != want[k]]
            raise CheckpointError(
                f"{self.path}: its weights are not those of its architecture (first difference: "
                f"{odd[0]}); it was written by another version of mlx-fleet, use that one"
            )
        return have

    def model(self) -> GPT:
        """The GPT of this checkpoint, in the dtype it was saved in."""
        model = GPT(self.cfg)
        model.load_weights(list(self.weights().items()))
        model.eval()
        mx.eval(model.parameters())
        return model

    def tokenizer(self, override: str | None = None) -> Tokenizer:
        """The tokenizer the model was trained with: `override` (a tokenizer.json), or the one
        its dataset names, checked against the manifest either way."""
        recorded = self.manifest.get("tokenizer") or {}
        kind = recorded.get("kind")
        if kind == "synthetic":
            raise TokenizerError(
                f"{self.path} was trained on synthetic tokens and has no tokenizer; "
                "train on data made by `fleet prepare` to get a model of text"
            )
        if override:
            tok = load_tokenizer(override)
        elif kind == "byte":
            tok = load_tokenizer({"kind": "byte"})
        else:
            tok = self._dataset_tokenizer(recorded)
        if identity_digest_part(tok.identity()) != recorded:
            sha = str(recorded.get("sha256", ""))[:12]
            raise TokenizerError(
                f"{override or 'the tokenizer found'} is not the one {self.path.name} was "
                f"trained with ({kind}{', sha256 ' + sha + '...' if sha else ''}); "
                "pass that one with --tokenizer"
            )
        if tok.vocab_size > self.cfg.vocab:
            raise TokenizerError(
                f"the tokenizer has {tok.vocab_size} tokens but the model only {self.cfg.vocab}"
            )
        return tok

    def _dataset_tokenizer(self, recorded: dict[str, Any]) -> Tokenizer:
        data = self.train_config().get("data") or "?"
        sha = str(recorded.get("sha256", ""))[:12]
        hint = f"pass --tokenizer PATH (the tokenizer.json of sha256 {sha}...)"
        try:
            return load_tokenizer(read_meta(Path(data))["tokenizer"])
        except (DatasetError, TokenizerError) as e:
            raise TokenizerError(
                f"cannot find the tokenizer of {self.path.name} through its dataset {data} "
                f"({str(e).splitlines()[0]}); {hint}"
            ) from None


def find(target: str | Path, *, best: bool = False) -> Trained:
    """The verified checkpoint `target` names (a checkpoint, or a run's latest or best)."""
    target = Path(target)
    warnings: list[str] = []
    if not target.exists():
        folder = target.parent if target.parent.name == catalog.root(".").name else None
        have = [p.name for p in catalog.complete(folder.parent)] if folder else []
        known = f" (its run has {', '.join(have)})" if have else ""
        raise CheckpointError(
            f"{target} does not exist{known}; give a run's --run-dir or one of its "
            "checkpoints/step-* folders"
        )
    if (target / catalog.MANIFEST).is_file():
        if best:
            raise CheckpointError(
                f"{target} is a checkpoint; --best and --latest choose within a run folder"
            )
        path, manifest = target, catalog.verify(target)
    elif catalog.root(target).is_dir():
        which = catalog.BEST if best else catalog.LATEST
        path, manifest, warnings = catalog.resolve(target, which)
    else:
        raise CheckpointError(
            f"{target}: neither a checkpoint (no {catalog.MANIFEST}) nor a run folder "
            "(no checkpoints/); give a run's --run-dir or one of its checkpoints/step-* folders"
        )
    return Trained(path, manifest, architecture(manifest, path), warnings)


def architecture(manifest: dict[str, Any], path: Path) -> ModelConfig:
    """The ModelConfig a manifest records, or a refusal naming what does not fit."""
    arch = manifest.get("architecture")
    if not isinstance(arch, dict):
        raise CheckpointError(f"{path}: its manifest records no architecture; not an mlx-fleet GPT")
    known = {f.name for f in fields(ModelConfig)}
    needed = {f.name for f in fields(ModelConfig) if f.default is MISSING}
    unknown, missing = sorted(set(arch) - known), sorted(needed - set(arch))
    if unknown or missing:
        what = f"unknown {', '.join(unknown)}" if unknown else f"lacks {', '.join(missing)}"
        raise CheckpointError(
            f"{path}: another architecture ({what}); it was written by another version of "
            "mlx-fleet, use that one"
        )
    try:
        cfg = ModelConfig(**arch)
        ModelConfig.from_sizes(  # the same checks a new run's sizes get
            depth=cfg.depth, width=cfg.width, heads=cfg.heads, vocab=cfg.vocab, seq_len=cfg.seq_len
        )
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: its architecture does not build a GPT: {e}") from None
    return cfg
