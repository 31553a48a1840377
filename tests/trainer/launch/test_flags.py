"""fleet launch's own numbers are checked before anything starts (issue 19 item 8): a
negative backoff lost the restart, negative restarts meant no limit, a NaN backoff waited
300 s, a negative or NaN grace was taken as given."""

from __future__ import annotations

import argparse

import pytest

from tests.support.fleet import run_fleet
from trainer.launch.launcher import add_arguments
from trainer.launch.plan import LaunchError, plan_launch


def parse(*argv: str, train: tuple[str, ...] = ()) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([*argv, "-n", "2", "--", "train", "--synthetic", *train])


def test_cpu_ranks_get_the_ring_backend_unless_one_is_named(tmp_path):
    # mlx.launch's own choice on a CUDA machine is NCCL, one GPU a rank: no GPU for a CPU run
    run = ("--run-dir", str(tmp_path / "r"))
    assert plan_launch(parse(train=("--device", "cpu", *run))).backend == "ring"
    assert plan_launch(parse("--backend", "any", train=("--device", "cpu", *run))).backend == "any"
    assert plan_launch(parse(train=run)).backend is None  # mlx.launch's default


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--restart-backoff", "-1"), "--restart-backoff must be at least 0, got -1"),
        (("--restart-backoff", "nan"), "--restart-backoff must be a finite number, got nan"),
        (("--restarts", "-1"), "--restarts must be at least 0, got -1"),
        (("--stop-grace", "-1"), "--stop-grace must be at least 0, got -1"),
        (("--stop-grace", "nan"), "--stop-grace must be a finite number, got nan"),
        (("--lifeline-timeout", "0"), "--lifeline-timeout must be more than 0, got 0"),
        (("--lifeline-timeout", "inf"), "--lifeline-timeout must be a finite number, got inf"),
    ],
)
def test_launch_flags_are_refused_by_name(flags, message):
    with pytest.raises(LaunchError, match=message.replace("(", r"\(")):
        plan_launch(parse(*flags))


def test_a_bad_flag_stops_fleet_launch_in_one_line(tmp_path):
    out = run_fleet(
        *("launch", "-n", "2", "--restart-backoff", "nan", "--", "train", "--synthetic"),
        *("--run-dir", str(tmp_path / "r")),
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "fleet launch: error: --restart-backoff must be a finite number, got nan"
    )
    assert not (tmp_path / "r").exists()
