"""`fleet export`: a trained checkpoint as an mlx-lm `nanochat` folder, proven by mlx-lm itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten

from fleet.cli import main as fleet
from tests.support.fleet import fleet_env
from tests.support.tiny_run import fails, train_tiny
from trainer.data.prepare import PrepareConfig, prepare
from trainer.data.tokenizer import ByteTokenizer, HFTokenizer, byte_tokenizer_json
from trainer.model import trained
from trainer.model.config import ModelConfig
from trainer.model.export import export, mlx_lm_config, mlx_lm_weights
from trainer.model.gpt import GPT

mlx_lm = pytest.importorskip("mlx_lm")  # the `export` extra; in `dev` too
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def run(tiny_data, tmp_path_factory) -> Path:
    return train_tiny(tiny_data, tmp_path_factory.mktemp("export") / "run")


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "model"
    assert fleet(["export", str(run), "--out", str(out)]) == 0
    return out


def val_rows(data: Path, n: int = 4) -> mx.array:
    """Token rows the model did not train on, from the dataset's held-out shards."""
    from trainer.data.dataset import Dataset

    ds = Dataset.open(data)
    rows = np.concatenate([ds.read_group(g) for g in ds.val_groups])[:n, :-1]
    return mx.array(rows.astype(np.int32))


# --- the proof: mlx-lm's logits are ours -------------------------------------------------
def test_mlx_lm_logits_equal_ours_fp32(run, exported, tiny_data):
    ours = trained.find(run).model()
    model, _ = mlx_lm.load(str(exported))
    ids = val_rows(tiny_data)
    mine, theirs = ours(ids), model(ids)
    assert theirs.dtype == mx.float32 and theirs.shape == mine.shape
    diff = mx.abs(mine - theirs).max().item()
    assert diff <= 1e-4, diff
    assert mine.std().item() > 0.5  # a model with something to compare


def test_the_rotary_conversion_is_needed(run, tiny_data):
    """Without the sign flip mlx-lm's nanochat turns the other way: clearly other logits."""
    from mlx_lm.models import nanochat

    t = trained.find(run)
    params = t.weights()
    model = nanochat.Model(nanochat.ModelArgs.from_dict(mlx_lm_config(t.cfg)))
    renamed = mlx_lm_weights(params, t.cfg, mx.float32)
    model.load_weights(list(zip(renamed, params.values(), strict=True)))  # names only
    ids = val_rows(tiny_data)
    assert mx.abs(t.model()(ids) - model(ids)).max().item() > 1e-2


def test_mlx_lm_generate_gives_our_greedy_text(run, exported):
    from trainer.model.generate import generate_ids

    model, tok = mlx_lm.load(str(exported))
    text = mlx_lm.generate(model, tok, "def ", max_tokens=24)  # greedy by default
    ours = trained.find(run)
    byte = ByteTokenizer()
    ids = generate_ids(ours.model(), [100, 101, 102, 32], 24, temperature=0, stop=byte.eos_id)
    assert isinstance(text, str) and text
    assert text == byte.decode(list(ids))


def test_mlx_lm_command_line_generates(exported):
    proc = subprocess.run(
        [sys.executable, "-m", "mlx_lm", "generate", "--model", str(exported)]
        + ["--prompt", "import ", "--max-tokens", "16"],
        capture_output=True,
        text=True,
        timeout=300,
        env=fleet_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("==========") == 2, proc.stdout  # the text between two rules
    assert proc.stdout.split("==========")[1].strip("\n")


def test_bf16_export_loads_and_agrees(run, exported, tmp_path, tiny_data):
    out = tmp_path / "bf16"
    assert fleet(["export", str(run), "--out", str(out), "--dtype", "bf16"]) == 0
    model, tok = mlx_lm.load(str(out))
    assert {p.dtype for _, p in tree_flatten(model.parameters())} == {mx.bfloat16}
    half, full = (d / "model.safetensors" for d in (out, exported))
    assert half.stat().st_size < 0.6 * full.stat().st_size
    ids = val_rows(tiny_data)
    fp32, _ = mlx_lm.load(str(exported))
    diff = mx.abs(model(ids).astype(mx.float32) - fp32(ids)).max().item()
    assert diff < 0.25, diff  # bf16 rounding of weights and activations, nothing more
    assert mlx_lm.generate(model, tok, "def ", max_tokens=8)


def test_export_folder_and_origin(run, exported):
    names = {p.name for p in exported.iterdir()}
    assert names == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "origin.json",
    }
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "nanochat" and config["vocab_size"] == 320  # 259 padded
    origin = json.loads((exported / "origin.json").read_text())
    manifest = json.loads((run / "checkpoints" / "latest" / "manifest.json").read_text())
    for key in ("architecture", "tokenizer", "dataset"):
        assert origin[key] == manifest[key]
    assert origin["step"] == 60 and "val_loss" in origin and origin["dtype"] == "fp32"
    assert origin["weights_sha256"] == manifest["files"]["weights.safetensors"]["sha256"]
    weights = mx.load(str(exported / "model.safetensors"))
    assert "transformer.h.1.attn.c_q.weight" in weights and "lm_head.weight" in weights


def test_parameter_counts_agree_at_depth_12():
    """Both count 135,266,304 at depth 12, width 768, vocab 32768 (lazy: nothing allocated)."""
    from mlx_lm.models import nanochat

    cfg = ModelConfig.from_sizes(depth=12, width=768, vocab=32768, seq_len=2048)
    theirs = nanochat.Model(nanochat.ModelArgs.from_dict(mlx_lm_config(cfg)))
    ours = GPT(cfg)
    assert ours.num_params() == 135_266_304
    assert sum(p.size for _, p in tree_flatten(theirs.parameters())) == 135_266_304
    shapes = {k: v.shape for k, v in tree_flatten(ours.parameters())}
    renamed = mlx_lm_weights({k: mx.zeros((1, 1)) for k in shapes}, cfg, mx.float32)
    assert set(renamed) == {k for k, _ in tree_flatten(theirs.parameters())}


# --- tokenizers: the byte tokenizer as an equivalent tokenizer.json -----------------------
@pytest.fixture(scope="module")
def hf_byte(exported):
    return transformers.AutoTokenizer.from_pretrained(str(exported))


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_byte_tokenizer_json_encodes_and_decodes_as_ours(hf_byte, text):
    ours = ByteTokenizer()
    ids = ours.encode(text).tolist()
    assert hf_byte.encode(text) == ids  # mlx-lm's prompt encoding: no BOS added
    assert hf_byte.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64), specials=st.lists(st.sampled_from([256, 257, 258])))
def test_byte_tokenizer_json_decodes_invalid_utf8_as_ours(hf_byte, data, specials):
    ids = list(data) + specials
    assert hf_byte.decode(ids, skip_special_tokens=True) == ByteTokenizer().decode(ids)


def test_byte_tokenizer_json_keeps_our_special_ids(hf_byte, tmp_path):
    assert (hf_byte.bos_token_id, hf_byte.eos_token_id, hf_byte.pad_token_id) == (256, 257, 258)
    assert hf_byte.encode("<|endoftext|>") == list(b"<|endoftext|>")  # literal, as ours
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(byte_tokenizer_json()))
    ours = HFTokenizer(path)  # our own reader finds the same special ids
    assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.vocab_size) == (256, 257, 258, 259)
    assert ours.decode(ours.encode("naïve 🚀")) == "naïve 🚀"


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """A run on data prepared with a tokenizer.json (kind 'tokenizers'), and that file."""
    root = tmp_path_factory.mktemp("hf")
    tok = root / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    tok.write_text(json.dumps(byte_tokenizer_json()))
    data = root / "data"
    prepare(
        PrepareConfig(
            out=data, stdlib=True, max_files=6, seq_len=32, rows_per_group=64, tokenizer=str(tok)
        )
    )
    return train_tiny(data, root / "run", updates=4), data, tok


def test_tokenizer_json_export_copies_the_file(hf_run, tmp_path):
    run, _, tok = hf_run
    out = tmp_path / "m"
    assert fleet(["export", str(run), "--out", str(out)]) == 0
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()
    model, hf = mlx_lm.load(str(out))
    assert hf.eos_token_id == 257 and mlx_lm.generate(model, hf, "x", max_tokens=4) is not None


# --- bad input: one line that says what to do ---------------------------------------------
def test_missing_tokenizer_says_pass_tokenizer(hf_run, tmp_path, capsys):
    run, data, tok = hf_run
    moved = tmp_path / "moved.json"
    shutil.copy(tok, moved)
    hidden = data.with_name("data-away")
    data.rename(hidden)
    try:
        err = fails(capsys, "export", str(run), "--out", str(tmp_path / "m"))
        assert "cannot find the tokenizer" in err and "--tokenizer PATH" in err
        given = ["--out", str(tmp_path / "m"), "--tokenizer", str(moved)]
        assert fleet(["export", str(run), *given]) == 0
        assert (tmp_path / "m" / "tokenizer.json").read_bytes() == tok.read_bytes()
        wrong = tmp_path / "wrong.json"
        wrong.write_text(tok.read_text().replace("<pad>", "<PAD>"))
        err = fails(capsys, "sample", str(run), "--tokenizer", str(wrong))
        assert "is not the one" in err and "--tokenizer" in err
    finally:
        hidden.rename(data)


def test_synthetic_run_has_no_tokenizer(tmp_path, capsys):
    run = train_tiny(None, tmp_path / "syn", synthetic=True, seq_len=16, vocab=64, updates=1)
    err = fails(capsys, "export", str(run), "--out", str(tmp_path / "m"))
    assert "synthetic tokens" in err and "fleet prepare" in err
    assert "synthetic tokens" in fails(capsys, "sample", str(run))


def _copy_checkpoint(run: Path, dest: Path, **arch) -> Path:
    """A copy of run's latest checkpoint whose manifest records `arch` changes (sealed with
    the manifest's own digest again: a well-formed checkpoint of another model, not damage)."""
    from trainer.checkpoint import manifest as mf

    shutil.copytree((run / "checkpoints" / "latest").resolve(), dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["architecture"] |= arch
    manifest["digest"] = mf.digest(manifest)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


@pytest.mark.parametrize("command", ["export", "sample"])
def test_another_architecture_is_refused(run, tmp_path, capsys, command):
    out = ["--out", str(tmp_path / "m")] if command == "export" else []
    ckpt = _copy_checkpoint(run, tmp_path / "moe", experts=8)
    err = fails(capsys, command, str(ckpt), *out)
    assert "another architecture (unknown experts)" in err and "another version" in err
    ckpt = _copy_checkpoint(run, tmp_path / "wide", width=128, heads=2)
    err = fails(capsys, command, str(ckpt), *out)
    assert "weights are not those of its architecture" in err


def test_inexact_conversion_is_refused(run, tmp_path, capsys):
    ckpt = _copy_checkpoint(run, tmp_path / "eps", norm_eps=1e-6)
    err = fails(capsys, "export", str(ckpt), "--out", str(tmp_path / "m"))
    assert "cannot be exported exactly" in err and "eps 1e-06" in err
    assert not (tmp_path / "m").exists()


def test_existing_out_needs_force(run, exported, tmp_path, capsys):
    err = fails(capsys, "export", str(run), "--out", str(exported))
    assert "exists: pass --force" in err
    out = tmp_path / "again"
    shutil.copytree(exported, out)
    (out / "stale.txt").write_text("from before")
    assert fleet(["export", str(run), "--out", str(out), "--force"]) == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    keep = tmp_path / "precious"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    err = fails(capsys, "export", str(run), "--out", str(keep), "--force")
    assert "is not an export" in err and (keep / "notes.txt").is_file()


@pytest.mark.parametrize("command", ["export", "sample"])
def test_best_without_evaluations(run, tmp_path, capsys, command):
    out = ["--out", str(tmp_path / "m")] if command == "export" else []
    err = fails(capsys, command, str(run), "--best", *out)
    assert err.endswith("this run kept no best checkpoint: it needs --eval-every")
    assert "nowhere does not exist" in fails(capsys, command, str(tmp_path / "nowhere"), *out)
    (tmp_path / "folder").mkdir()  # there, but neither a checkpoint nor a run
    assert "neither a checkpoint" in fails(capsys, command, str(tmp_path / "folder"), *out)


def test_best_follows_the_link(run, tmp_path):
    """--best resolves RUN/checkpoints/best as `latest` resolves (the link names a folder)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    (copy / "checkpoints" / "best").symlink_to("step-000060")
    out = tmp_path / "m"
    assert fleet(["export", str(copy), "--best", "--out", str(out)]) == 0
    assert json.loads((out / "origin.json").read_text())["checkpoint"].endswith("step-000060")


def test_export_needs_no_mlx_lm(run, tmp_path, monkeypatch):
    """Exporting needs only mlx: mlx-lm is what loads the folder, never what writes it."""
    monkeypatch.setitem(sys.modules, "mlx_lm", None)
    path = export(trained.find(run), tmp_path / "m")
    assert (path / "model.safetensors").is_file()
