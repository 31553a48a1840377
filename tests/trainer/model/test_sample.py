"""Generation with a KV cache, and `fleet sample`: cached equals uncached, and text streams."""

from __future__ import annotations

import io
from pathlib import Path

import mlx.core as mx
import pytest

from fleet.cli import main as fleet
from tests.support.tiny_run import fails, train_tiny
from trainer.data.tokenizer import ByteTokenizer
from trainer.model import cache as kv_cache
from trainer.model import generate, trained
from trainer.model.cache import KVCache
from trainer.model.generate import TextStream, generate_ids, stream
from trainer.model.gpt import GPT


@pytest.fixture(scope="module")
def run(tiny_data, tmp_path_factory) -> Path:
    return train_tiny(tiny_data, tmp_path_factory.mktemp("sample") / "run")


@pytest.fixture(scope="module")
def model(run) -> GPT:
    return trained.find(run).model()


def uncached_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    """The reference: the whole (windowed) prefix through the model for every token."""
    ids, out = list(prompt), []
    for _ in range(n):
        logits = model(mx.array([ids[-model.cfg.seq_len :]]))[0, -1]
        out.append(int(mx.argmax(logits.astype(mx.float32)).item()))
        ids.append(out[-1])
    return out


@pytest.fixture
def calls(monkeypatch) -> list[tuple[int, ...]]:
    """The shape of every input GPT.extend is given."""
    seen: list[tuple[int, ...]] = []
    real = GPT.extend

    def spy(self, idx, cache):
        seen.append(tuple(idx.shape))
        return real(self, idx, cache)

    monkeypatch.setattr(GPT, "extend", spy)
    return seen


def test_cached_greedy_equals_uncached_token_for_token(model, calls):
    prompt = list(b"def main(")
    n = model.cfg.seq_len - len(prompt)  # the whole context, never cropped
    got = list(generate_ids(model, prompt, n, temperature=0))
    assert got == uncached_greedy(model, prompt, n)
    # one pass over the prompt, then one position per token: no prefix recomputed
    assert calls == [(1, len(prompt))] + [(1, 1)] * (n - 1)


def test_cached_logits_equal_the_full_pass(model):
    ids = mx.array([list(b"import os\nimport sys\n\ndef f(x):\n")[:32]])
    full = model(ids)
    cache = generate.new_cache(model)
    parts = [model.extend(ids[:, :10], cache)]
    parts += [model.extend(ids[:, t : t + 1], cache) for t in range(10, 32)]
    assert mx.abs(mx.concatenate(parts, axis=1) - full).max().item() < 1e-4
    assert cache[0].offset == 32


def test_a_full_context_keeps_going_within_the_trained_window(model, monkeypatch):
    seen = []
    real = KVCache.update

    def spy(self, k, v):
        out = real(self, k, v)
        seen.append(self.offset)
        return out

    monkeypatch.setattr(KVCache, "update", spy)
    window = model.cfg.seq_len
    got = list(generate_ids(model, [10], 3 * window, temperature=0.8, seed=3))
    assert len(got) == 3 * window
    assert max(seen) == window  # rotary distances never beyond what the model trained on


def test_the_cache_grows_in_blocks(monkeypatch):
    monkeypatch.setattr(kv_cache, "CACHE_STEP", 4)
    cache = KVCache()
    for t in range(6):
        k = mx.full((1, 2, 1, 8), float(t))
        keys, values = cache.update(k, -k)
    assert cache.keys.shape[2] == 8 and keys.shape == (1, 2, 6, 8)
    assert keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5] and values[0, 0, 5, 0].item() == -5


def test_sampling_is_reproducible_and_top_k_1_is_greedy(model):
    prompt = list(b"class ")
    a = list(generate_ids(model, prompt, 20, temperature=1.0, seed=7))
    assert a == list(generate_ids(model, prompt, 20, temperature=1.0, seed=7))
    others = [list(generate_ids(model, prompt, 20, temperature=1.0, seed=s)) for s in (8, 9)]
    assert a not in others
    greedy = list(generate_ids(model, prompt, 20, temperature=0))
    assert list(generate_ids(model, prompt, 20, temperature=1.0, top_k=1, seed=5)) == greedy


def test_generate_gives_the_ids_as_a_list(model):
    ids = generate.generate(model, list(b"def "), 12, temperature=0.8, seed=4)
    assert ids == list(generate_ids(model, list(b"def "), 12, temperature=0.8, seed=4))
    assert generate.generate(model, list(b"def "), 0) == []


def test_generation_stops_at_end_of_text(model):
    first = next(iter(generate_ids(model, [1, 2, 3], 5, temperature=0)))
    assert list(generate_ids(model, [1, 2, 3], 5, temperature=0, stop=first)) == [first]
    with pytest.raises(ValueError, match="at least one prompt token"):
        next(iter(generate_ids(model, [], 5)))


def test_text_stream_holds_back_a_split_character():
    text = TextStream(ByteTokenizer().decode)
    pieces = [text.add(b) for b in "aé😀".encode()]
    assert pieces == ["a", "", "é", "", "", "", "😀"]
    text.add(0xE2)  # a cut character at the very end comes out, replaced, at the finish
    assert text.finish() == "\ufffd"


def test_stream_writes_as_it_generates(model, calls):
    writes: list[tuple[str, int]] = []  # each piece with the model calls made before it
    tok = ByteTokenizer()
    text = stream(model, tok, "def ", 40, lambda s: writes.append((s, len(calls))), seed=1)
    assert text == "".join(s for s, _ in writes) and text.startswith("def ")
    assert writes[0] == ("def ", 0)  # the prompt, before the model ran
    made = [n for _, n in writes[1:]]
    assert len(made) > 5 and made[0] < made[-1]  # pieces came out while it generated
    assert text == "def " + tok.decode(list(generate_ids(model, list(b"def "), 40, seed=1)))


class Recorder(io.StringIO):
    """stdout that remembers what had been written at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def test_fleet_sample_prints_as_it_goes(run, model, monkeypatch, capsys):
    out = Recorder()
    monkeypatch.setattr("sys.stdout", out)
    argv = ["sample", str(run), "--prompt", "import ", "--tokens", "30", "--temperature", "0"]
    assert fleet(argv) == 0
    greedy = generate_ids(model, list(b"import "), 30, temperature=0, stop=257)
    assert out.getvalue() == "import " + ByteTokenizer().decode(list(greedy)) + "\n"
    assert len(set(out.flushed)) > 5  # flushed piece by piece, not once at the end
    assert "update 60" in capsys.readouterr().err


def test_fleet_sample_defaults_to_the_runs_prompt(run, monkeypatch):
    out = Recorder()
    monkeypatch.setattr("sys.stdout", out)
    assert fleet(["sample", str(run), "--tokens", "5", "--seed", "2"]) == 0
    assert out.getvalue().startswith("def ")  # TrainConfig's default --prompt
    prompts = []
    real = generate.generate_ids

    def spy(m, prompt, *args, **kw):
        prompts.append(prompt)
        return real(m, prompt, *args, **kw)

    monkeypatch.setattr(generate, "generate_ids", spy)
    assert fleet(["sample", str(run), "--prompt", "", "--tokens", "5", "--seed", "2"]) == 0
    assert prompts == [[ByteTokenizer().eos_id]]  # an empty prompt: a new document


def test_fleet_sample_takes_mlx_lms_names_too(run, monkeypatch):
    """Issue 18: `fleet sample` accepts mlx_lm.generate's --max-tokens and --temp."""
    texts = []
    for argv in (["--tokens", "12", "--temperature", "0"], ["--max-tokens", "12", "--temp", "0"]):
        out = Recorder()
        monkeypatch.setattr("sys.stdout", out)
        assert fleet(["sample", str(run), "--prompt", "import ", *argv]) == 0
        texts.append(out.getvalue())
    assert texts[0] == texts[1] and len(texts[0]) > len("import ")


@pytest.mark.parametrize("name", ["sample", "export"])
def test_a_missing_target_is_said_to_not_exist(run, tmp_path, capsys, name):
    """Issue 18, defect 11: a missing path was "neither a checkpoint nor a run folder"."""
    out = ("--out", str(tmp_path / "x")) if name == "export" else ()
    err = fails(capsys, name, str(tmp_path / "nope"), *out)
    assert f"{tmp_path / 'nope'} does not exist" in err
    missing = run / "checkpoints" / "step-999999"
    err = fails(capsys, name, str(missing), *out)
    assert f"{missing} does not exist (its run has step-000060)" in err


def test_fleet_sample_refuses_negative_tokens(run, capsys):
    assert "give 0 or more" in fails(capsys, "sample", str(run), "--tokens", "-1")


def test_training_samples_use_the_cache(tiny_data, tmp_path, capsys, calls):
    train_tiny(tiny_data, tmp_path / "run", updates=2, sample_every=1, sample_tokens=8)
    out = capsys.readouterr().out
    assert out.count("sample step") == 2
    assert calls.count((1, 1)) == 2 * 7  # after the prompt, one position per token
