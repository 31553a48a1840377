"""A sweep spec is checked before anything starts: each mistake is one line naming the key."""

from __future__ import annotations

import pytest

from trainer.sweep.plan import trial_plan
from trainer.sweep.spec import SpecError, load


def write(tmp_path, text: str, data=None):
    body = text.replace("DATA", str(data or tmp_path / "none"))
    path = tmp_path / "spec.toml"
    path.write_text(body)
    return path


BASE = """
trials = 4
[train]
data = "DATA"
depth = 1
width = 32
local_batch = 4
[search]
lr = { low = 1e-4, high = 1e-2, log = true }
weight_decay = [0.0, 0.1]
[budget]
tokens = 20480
evals = 4
"""


def test_a_good_spec_parses_with_its_defaults(tmp_path, tiny_data):
    spec = load(write(tmp_path, BASE, tiny_data))
    assert spec.name == "spec" and str(spec.folder) == "sweeps/spec"
    assert [p.describe() for p in spec.params] == [
        "--lr log-uniform in [0.0001, 0.01]",
        "--weight-decay in [0.0, 0.1]",
    ]
    assert (spec.sampler, spec.metric, spec.direction, spec.rule) == (
        "tpe",
        "val_bpb",
        "minimize",
        "median",
    )
    assert spec.warmup == 0.5 and spec.top_k == 3 and spec.seeds == (1, 2)
    # 20480 tokens of 4 rows x 32 tokens: 160 updates, evaluated every 40.
    tp = trial_plan(spec, {"lr": 1e-3})
    assert (tp.updates, tp.eval_every, tp.tokens_per_update) == (160, 40, 128)
    # a batch searched changes the updates, never the tokens
    assert trial_plan(spec, {"local_batch": 8}).updates == 80


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("depth = 1", "depht = 1"), "[train] --depht is not a fleet train flag"),
        (("weight_decay = [0.0, 0.1]", "wieght_decay = [0.0, 0.1]"), "--wieght-decay is not a"),
        (("lr = { low", "updates = { low"), "--updates is set by the sweep"),
        (("weight_decay = [0.0, 0.1]", "seed = [1, 2]"), "--seed cannot be searched"),
        (("[budget]", "[budget]\nmetric = 3"), "[budget]: unknown key 'metric'"),
        (("tokens = 20480", "tokens = 100"), "less than 4 evaluations of one update"),
        (("evals = 4", "evals = 4\n[metric]\nname = 'val_ppl'"), "not one a trial produces"),
        (("low = 1e-4", "low = -1e-4"), "--lr must be positive"),
        (("low = 1e-4, high = 1e-2", "low = 1e-2, high = 1e-4"), "must be below high"),
        (("weight_decay = [0.0, 0.1]", "weight_decay = [0.1, 0.1]"), "listed twice"),
        (("weight_decay = [0.0, 0.1]", "optimizer = ['adamw', 'sgd']"), "must be one of"),
        (("depth = 1", "depth = 1\nlr = 1e-3"), "both fixed in [train] and searched"),
        (("evals = 4", "evals = 4\n[champion]\nseeds = [0, 1]"), "must be new seeds"),
        (("trials = 4", "trials = 4\nsampler = 'grid'"), "--lr has a range"),
    ],
)
def test_each_mistake_is_one_line_naming_it(tmp_path, tiny_data, change, message):
    old, new = change
    assert old in BASE
    with pytest.raises(SpecError) as e:
        load(write(tmp_path, BASE.replace(old, new), tiny_data))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_empty_search_space_is_refused(tmp_path, tiny_data):
    text = BASE[: BASE.index("[search]")] + "[search]\n" + BASE[BASE.index("[budget]") :]
    with pytest.raises(SpecError, match="the search space is empty"):
        load(write(tmp_path, text, tiny_data))
    with pytest.raises(SpecError, match="the search space is empty"):
        load(write(tmp_path, text.replace("[search]\n", ""), tiny_data))


def test_a_metric_the_run_cannot_produce_is_refused(tmp_path):
    text = BASE.replace('data = "DATA"', "synthetic = true\nseq_len = 32")
    with pytest.raises(SpecError, match="val_bpb needs a dataset"):
        load(write(tmp_path, text))
    ok = load(write(tmp_path, text + "[metric]\nname = 'val_loss'\n"))
    assert ok.metric == "val_loss"


def test_the_grid_covers_every_point_and_no_more(tmp_path, tiny_data):
    text = BASE.replace("lr = { low = 1e-4, high = 1e-2, log = true }", "lr = [1e-3, 3e-3, 1e-2]")
    text = text.replace("trials = 4", "sampler = 'grid'\ntrials = 0")
    spec = load(write(tmp_path, text, tiny_data))
    assert spec.trials == 6 and spec.grid() == {"lr": [1e-3, 3e-3, 1e-2], "weight_decay": [0, 0.1]}
    with pytest.raises(SpecError, match="only 6 points"):
        load(write(tmp_path, text.replace("trials = 0", "trials = 7"), tiny_data))


def test_a_missing_dataset_and_bad_toml_are_one_line(tmp_path):
    with pytest.raises(SpecError, match="no such folder"):
        load(write(tmp_path, BASE))
    with pytest.raises(SpecError, match="not valid TOML"):
        load(write(tmp_path, "trials = = 3"))
