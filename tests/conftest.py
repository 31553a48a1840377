"""Shared fixtures: a tiny prepared dataset, free loopback ports, and `fleet` in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fleet import free_port


@pytest.fixture
def port_base():
    return free_port(8)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A byte-tokenized dataset of a few standard-library files, 32-token rows."""
    from trainer.data.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare(
        PrepareConfig(
            out=out, stdlib=True, max_files=12, seq_len=32, rows_per_group=64, val_fraction=0.05
        )
    )
    return out


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A real sshd on a loopback address (tests/support/sshd.py), one per test module."""
    from tests.support.sshd import SSHD

    server = SSHD(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()
