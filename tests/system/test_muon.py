"""Muon on real ranks: exact resume, and any split gives the same update (slow)."""

from __future__ import annotations

import pytest

from tests.support.ranks import assert_same_weights, launch, single, weights

MUON = ("--optimizer", "muon")


@pytest.mark.slow
def test_muon_resumes_exactly_and_any_split_gives_the_same_update(tiny_data, tmp_path):
    both = ("--updates", "4", "--checkpoint-every", "2", *MUON)
    single(tiny_data, tmp_path / "whole", "--local-batch", "6", *both)
    # the same run stopped at 2 and resumed
    single(tiny_data, tmp_path / "legs", "--local-batch", "6", *both, "--stop-at", "2")
    single(tiny_data, tmp_path / "legs", "--resume", "latest")
    assert_same_weights(weights(tmp_path / "whole", 4), weights(tmp_path / "legs", 4))
    launch(3, tiny_data, tmp_path / "split", "--local-batches", "3,2,1", *both)
    for step in (2, 4):
        assert_same_weights(weights(tmp_path / "whole", step), weights(tmp_path / "split", step))
