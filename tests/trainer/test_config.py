"""Configuration: flags, TOML files and their errors."""

from __future__ import annotations

import argparse
import re

import pytest

from trainer.config import ConfigError, TrainConfig, add_arguments, from_args, load_file


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_flags_override_the_file_which_overrides_defaults(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('data = "d"\ndepth = 3\nlocal-batches = [3, 2, 1]\nlr = 1\n')
    cfg = from_args(parse("--config", str(f), "--depth", "5"))
    assert (cfg.data, cfg.depth, cfg.local_batches, cfg.lr) == ("d", 5, "3,2,1", 1.0)
    assert cfg.accum == TrainConfig.accum  # untouched default
    assert cfg.split(3) == [3, 2, 1]


@pytest.mark.parametrize(
    "text, message",
    [
        ("depth = ", "not valid TOML"),
        ("depht = 3", "unknown key 'depht'"),
        ('depth = "three"', "depth must be int"),
        ('precision = "fp8"', "precision must be one of"),
        ("synthetic = 1", "synthetic must be true or false"),
    ],
)
def test_malformed_config_files_name_the_problem(tmp_path, text, message):
    f = tmp_path / "run.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_file(f)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_file(tmp_path / "nope.toml")


def test_per_rank_values_must_match_the_world():
    cfg = TrainConfig(synthetic=True, local_batches="3,2", cache_limit_gb="16,4,4")
    with pytest.raises(ConfigError, match="has 2 values"):
        cfg.split(3)
    with pytest.raises(ConfigError, match="one value, or one per rank"):
        cfg.per_rank("cache_limit_gb", 2, 0)
    assert cfg.per_rank("cache_limit_gb", 3, 1) == 4.0
    assert TrainConfig(cache_limit_gb="8").per_rank("cache_limit_gb", 5, 4) == 8.0
    with pytest.raises(ConfigError, match="at least 1"):
        TrainConfig(local_batches="2,0").split(2)


def test_a_run_needs_data_or_synthetic():
    with pytest.raises(ConfigError, match="--data"):
        TrainConfig().validate()


@pytest.mark.parametrize(
    "toml, message",
    [
        ("lr = nan", "--lr must be a finite number"),
        ("lr = inf", "--lr must be a finite number"),
        ("collective-timeout = -1.0", "--collective-timeout must not be negative"),
        ("depth = 100000000000000000000", "--depth 100000000000000000000 is beyond any machine"),
        ("beta2 = 1.0", "--beta2 must be in [0, 1)"),
        ("min-lr-ratio = 2.0", "--min-lr-ratio is a fraction"),
        ("log-every = 0", "--log-every must be at least 1"),
    ],
)
def test_every_bad_value_is_refused_by_name(tmp_path, toml, message):
    f = tmp_path / "run.toml"
    f.write_text(f"synthetic = true\n{toml}\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_args(parse("--config", str(f)))


def test_a_binary_config_file_is_refused_in_one_line(tmp_path):
    f = tmp_path / "run.toml"
    f.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="not a text file"):
        load_file(f)


def test_nan_lr_from_the_command_line_is_an_error_not_a_traceback(tmp_path):
    from tests.support.fleet import run_fleet

    proc = run_fleet("train", "--synthetic", "--lr", "nan", "--run-dir", str(tmp_path), check=False)
    assert proc.returncode == 2
    assert "fleet train: error: --lr must be a finite number" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--memory-limit-gb", "nan"), "--memory-limit-gb must be auto, 0 (none) or a positive"),
        (("--memory-limit-gb", "inf"), "--memory-limit-gb must be auto, 0 (none) or a positive"),
        (("--memory-limit-gb", "-4"), "--memory-limit-gb must be auto, 0 (none) or a positive"),
        (("--memory-limit-gb", "8,-1"), "--memory-limit-gb must be auto, 0 (none) or a positive"),
        (("--memory-limit-gb", "8,lots"), "--memory-limit-gb: 'lots' is neither auto nor a number"),
        (("--cache-limit-gb", "-1"), "--cache-limit-gb: every value must be at least 0"),
        (("--simulate-peak-gb", "nan"), "--simulate-peak-gb: nan is not a finite number"),
        (("--simulate-slowdown", "nan"), "--simulate-slowdown: nan is not a finite number"),
        (("--seed", "-1"), "--seed must be a whole number in [0, 2**32), got -1"),
        (("--seed", str(10**23)), "--seed must be a whole number in [0, 2**32)"),
    ],
)
def test_per_rank_values_and_the_seed_are_refused_by_name(flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        cfg = from_args(parse("--synthetic", *flags))
        cfg.slowdown(1, 0)


def test_a_local_batch_beyond_any_machine_and_a_huge_split_have_short_errors():
    cfg = from_args(parse("--synthetic", "--local-batches", "99999999999999"))
    with pytest.raises(ConfigError, match="a local batch beyond any machine"):
        cfg.split(1)
    huge = from_args(parse("--synthetic", "--local-batches", ",".join(["1"] * 400_000)))
    with pytest.raises(ConfigError) as e:
        huge.split(2)
    assert len(str(e.value)) < 300 and "400,000 values" not in str(e.value)
    assert "(799,999 characters)" in str(e.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2, 3]", "a config is a JSON object of keys, got a list"),
        ("[" * 100_000 + "]" * 100_000, "nests too deeply to be a config"),
        ('{"depth": ' + "[" * 50 + "]" * 50 + "}", "depth must be int, got [[[["),
    ],
    ids=["a list", "100k levels deep", "a deep value"],
)
def test_a_json_config_that_is_not_an_object_is_refused_in_one_line(tmp_path, text, message):
    f = tmp_path / "run.json"
    f.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        load_file(f)
    assert len(str(e.value)) < 300
