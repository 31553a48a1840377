"""`--help` shows every default and groups train's flags; a resume that reshapes the learning-
rate schedule says so (issue 14)."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from fleet.cli import SUBCOMMANDS
from trainer.config import FIELDS, GROUPS, TrainConfig, add_arguments


def help_of(name: str, *sub: str) -> str:
    from importlib import import_module

    parser = argparse.ArgumentParser(prog=f"fleet {name}")
    import_module(SUBCOMMANDS[name][0]).configure(name, parser)
    if sub:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[sub[0]]
    return parser.format_help()


def test_train_help_is_grouped_and_keeps_every_flag_and_default():
    text = help_of("train")
    titles = [
        "data and run folder:",
        "model:",
        "optimization:",
        "memory:",
        "evaluation and samples:",
        "checkpoints:",
        "distributed:",
        "telemetry:",
        "demo aids:",
    ]
    at = [text.index(t) for t in titles]
    assert at == sorted(at)  # in this order
    for name in FIELDS:
        assert f"--{name.replace('_', '-')}" in text
    assert "[default: 'runs/default']" in text and "[default: 47800]" in text
    body = text[text.index("options:") :]  # past the usage line
    assert body.index("--lr LR") > body.index("optimization:") > body.index("--depth DEPTH")
    # The flags parse as before: defaults suppressed, so explicit ones can be told apart.
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert vars(parser.parse_args([])) == {"config": None}
    assert vars(parser.parse_args(["--updates", "40", "--synthetic"])) == {
        "config": None,
        "updates": 40,
        "synthetic": True,
    }
    assert sorted(n for names in GROUPS.values() for n in names) == sorted(FIELDS)


@pytest.mark.parametrize(
    ("name", "sub", "shown"),
    [
        ("prepare", (), ["(default: 1024)", "(default: byte)", "(default: **/*.txt)"]),
        ("launch", (), ["(default: 32323)", "(default: 12345)", "(default: 0)"]),
        ("console", (), ["(default: 15.0)", "(default: 1.0)", "ports.json, else 47800)"]),
        ("telemetry", ("send",), ["(default: 127.0.0.1)", "(default: 60.0)", "else 47800)"]),
        ("telemetry", ("tail",), ["(default: 5.0)", "(default: 0 = print"]),
    ],
)
def test_help_shows_the_defaults(name, sub, shown):
    text = " ".join(help_of(name, *sub).split())
    for s in shown:
        assert s in text, s
    assert "(default: None)" not in text and "(default: False)" not in text


def _checkpoint(tmp_path, step: int, tokens: int, seq_len: int = 32, microbatch: int = 4):
    ckpt = tmp_path / f"step-{step:06d}"
    ckpt.mkdir()
    (ckpt / "state.json").write_text(json.dumps({"step": step, "tokens": tokens}))
    manifest = {
        "step": step,
        "global_batch": {"microbatch": microbatch, "accum": 4},
        "architecture": {"seq_len": seq_len},
    }
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    return ckpt


def test_resume_with_more_updates_says_the_schedule_is_stretched(tmp_path):
    from trainer.cli import schedule_note
    from trainer.optim import Schedule

    per_update = 4 * 4 * 32
    base = TrainConfig(synthetic=True, updates=30).to_dict()
    ckpt = _checkpoint(tmp_path, 30, 30 * per_update)
    new = TrainConfig(**{**base, "updates": 40})
    note = schedule_note(base, new, {"updates": 40, "resume": "latest"}, ckpt)
    was = Schedule.from_config(TrainConfig(**base), per_update)(30 * per_update)
    now = Schedule.from_config(new, per_update)(30 * per_update)
    assert math.isclose(was, 2e-4, rel_tol=1e-6) and now > was
    assert note == (
        "--updates 40 (was 30): the learning-rate schedule is stretched to 40 updates; "
        f"at update 30 the rate goes from {was:.2e} to {now:.2e}"
    )
    same = TrainConfig(**base)
    assert schedule_note(base, same, {"updates": 30, "resume": "latest"}, ckpt) == ""
    assert schedule_note(base, same, {"resume": "latest"}, ckpt) == ""
    lr = TrainConfig(**{**base, "lr": 1e-3})
    assert schedule_note(base, lr, {"lr": 1e-3}, ckpt).startswith(
        "--lr 0.001 (was 0.002): the learning-rate schedule changes; at update 30"
    )


def test_every_bench_flag_has_help_and_its_default():
    """Issue 18, defect 14: `fleet bench ... --help` listed flags without text or defaults."""
    parser = argparse.ArgumentParser(prog="fleet bench")
    from bench.cli import configure

    configure("bench", parser)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in action.choices.items():
        if name.startswith("_"):
            continue
        text = " ".join(sub.format_help().split())
        for a in sub._actions:
            if not a.option_strings or a.dest == "help":
                continue
            assert a.help, f"bench {name} {a.option_strings[0]} has no help"
            quiet = a.default in (None, False, "", []) or a.default is argparse.SUPPRESS
            if not quiet:
                assert f"(default: {a.default})" in text, f"bench {name} {a.option_strings[0]}"
    assert "_worker" not in parser.format_help()
