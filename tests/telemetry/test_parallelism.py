"""The run's parallel mode as the records name it: read back, said in words, never fatal."""

from __future__ import annotations

import pytest

from telemetry.parallelism import Parallelism, parse


@pytest.mark.parametrize(
    ("mode", "world", "tensor", "replicas", "words", "groups"),
    [
        ("data", 4, 1, 4, "data parallel", "data"),
        ("tensor", 2, 2, 1, "tensor parallel x2", "tensor (2 ranks a group)"),
        ("tensor:2", 4, 2, 2, "2 replicas x tensor 2", "tensor:2 (2 groups of 2 ranks)"),
        ("tensor:4", 4, 4, 1, "tensor parallel x4", "tensor:4 (4 ranks a group)"),
    ],
)
def test_each_mode_reads_back_and_says_its_groups(mode, world, tensor, replicas, words, groups):
    p = parse(mode, world)
    assert (p.mode, p.tensor, p.replicas) == (mode, tensor, replicas)
    assert p.describe() == words and p.groups() == groups
    assert p.fixed_split is (tensor > 1)


@pytest.mark.parametrize("odd", [None, "", "pipeline", "tensor:", "tensor:x", "tensor:0"])
def test_an_unknown_or_missing_mode_reads_as_data_parallel(odd):
    # Older logs carry no mode, and a record from a newer or broken peer must not stop anyone.
    assert parse(odd, 3) == Parallelism("data", 1, 3)


def test_a_rank_s_slice_and_group():
    assert parse("tensor", 2).slice_of(1) == "slice 2 of 2"
    assert parse("tensor:2", 4).slice_of(3) == "slice 2 of 2, group 1"
    assert parse("data", 2).slice_of(1) == ""
