"""Rank 0's copies of its run folder's small files (trainer/keeper.py): taken as it writes
them, so that a folder removed at any moment after is written back whole."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from telemetry import ports, rundir
from tests.support.fleet import free_port
from tests.support.tiny_run import OneRank, smallest
from trainer.builder import open_run
from trainer.distributed import Cluster


def test_a_folder_removed_as_soon_as_its_ports_record_is_written_gets_it_back(
    tmp_path, monkeypatch
):
    """tests/system/test_removed_run_folder.py failed once in CI (a loaded 2-core box): the
    folder went between the ports record's write and rank 0's copy of it, taken later by
    reading the file back; nothing was there to read, the record was never written back,
    and `fleet telemetry send` knocked on the default port."""
    run_dir = tmp_path / "run"
    base = free_port(1)
    cfg = smallest(run_dir, telemetry_port_base=base)
    written = ports.keep

    def keep_then_remove(run, served):
        where = written(run, served)
        shutil.rmtree(run_dir)  # rm -rf RUN the moment the record is written
        return where

    monkeypatch.setattr(ports, "keep", keep_then_remove)
    run = open_run(cfg, Cluster(OneRank()), None, lambda msg: None)
    try:
        folder = rundir.at(run_dir)
        run.keeper.check(now=float("inf"))  # (or its watchdog did already)
        assert ports.parse(Path(folder.ports).read_text()).base == base
        assert json.loads(Path(folder.config).read_text())["telemetry_port_base"] == base
        assert Path(folder.control_key).read_bytes() == run.keeper.key
    finally:
        run.reporter.close()
