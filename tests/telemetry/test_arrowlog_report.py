"""The Arrow log survives crashes and resumes; `fleet report` reads the run back from it."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pytest
from rich.console import Console

from bench import synthetic
from fleet.cli import main as fleet_main
from telemetry.arrowlog import ArrowLog, log_ranks, read_events, read_stream, read_updates
from telemetry.errors import TelemetryError
from telemetry.records import Event
from telemetry.report import render, summarize


def write_batches(run_dir, rank: int, steps: range, close: bool = True) -> ArrowLog:
    log = ArrowLog(run_dir, rank)
    log.directory.mkdir(parents=True, exist_ok=True)
    for step in steps:  # one batch per update, as the writer thread does when it keeps up
        log.write([synthetic.update(step, rank)])
    if close:
        log.close()
    return log


def test_unclosed_writer_leaves_a_readable_log(tmp_path):
    log = write_batches(tmp_path, 0, range(1, 6), close=False)  # a crash: no end-of-stream
    assert read_updates(tmp_path, 0)["step"].to_pylist() == [1, 2, 3, 4, 5]
    batches, whole = read_stream(log.paths[0])
    assert whole and len(batches) == 5


def test_log_cut_mid_batch_keeps_the_batches_before(tmp_path):
    log = write_batches(tmp_path, 0, range(1, 6), close=False)
    path = log.paths[0]
    size = path.stat().st_size
    for cut in (size - 1, size - 40, size - 200):
        data = path.read_bytes()[:cut]
        damaged = tmp_path / "telemetry" / "rank-7.arrow"
        damaged.write_bytes(data)
        steps = read_updates(tmp_path, 7)["step"].to_pylist()
        assert steps == list(range(1, len(steps) + 1)) and 1 <= len(steps) < 5
        assert read_stream(damaged)[1] is False
    damaged.write_bytes(path.read_bytes()[:20])  # cut inside the schema
    assert read_updates(tmp_path, 7).num_rows == 0


def test_background_thread_writes_and_close_flushes(tmp_path):
    log = ArrowLog(tmp_path, 3, interval=0.05).start()
    for step in range(1, 101):
        log.put(synthetic.update(step, 3))
    log.put(Event("eval", 3, 100, data={"val_loss": 2.5, "val_tokens": 10}))
    log.close()
    assert read_updates(tmp_path, 3)["step"].to_pylist() == list(range(1, 101))
    (event,) = read_events(tmp_path, 3)
    assert event.kind == "eval" and event.data == {"val_loss": 2.5, "val_tokens": 10}
    assert log.dropped == 0 and log_ranks(tmp_path) == [3]


def test_resume_starts_a_new_segment_and_readers_join_them(tmp_path):
    write_batches(tmp_path, 0, range(1, 4))
    write_batches(tmp_path, 0, range(4, 7), close=False)  # resumed, then crashed
    write_batches(tmp_path, 0, range(7, 9))  # resumed again
    names = sorted(p.name for p in (tmp_path / "telemetry").iterdir())
    assert names == ["rank-0.1.arrow", "rank-0.2.arrow", "rank-0.arrow"]
    assert read_updates(tmp_path, 0)["step"].to_pylist() == list(range(1, 9))


def test_odd_values_are_coerced_not_fatal(tmp_path):
    class Scalar(float):  # what a numpy / mlx scalar looks like to the writer
        pass

    log = ArrowLog(tmp_path, 0)
    log.directory.mkdir(parents=True, exist_ok=True)
    rec = synthetic.update(1)
    rec.loss = Scalar(2.5)
    rec.mem_pressure = None
    bad = synthetic.update(2)
    bad.step = "two"  # type: ignore[assignment]
    log.write([rec, bad, Event("sample", 0, 1, data={"path": tmp_path})])
    log.close()
    table = read_updates(tmp_path, 0)
    assert table["loss"].to_pylist() == [2.5] and log.dropped == 1
    assert table.schema.field("loss").type == pa.float64()
    assert read_events(tmp_path, 0)[0].data == {"path": str(tmp_path)}


# --- report -----------------------------------------------------------------------------------


def test_report_names_the_straggler_and_shows_the_rebalance(tmp_path):
    synthetic.write_run(tmp_path, world_size=3, steps=60, slow_rank=2, rebalance_at=30)
    s = summarize(tmp_path)
    assert [r["rank"] for r in s["ranks"]] == [0, 1, 2]
    assert s["straggler"]["rank"] == 2 and s["straggler"]["excess"] > 0.1
    others = [r["median_compute_s"] for r in s["ranks"] if r["rank"] != 2]
    assert s["straggler"]["median_compute_s"] > max(others)
    fastest = min(s["ranks"], key=lambda r: r["median_compute_s"])
    assert fastest["wait_share"] > s["ranks"][2]["wait_share"]  # the fast wait for the slow
    (move,) = s["rebalances"]
    assert move["step"] == 30 and move["from"] == [4, 4, 4]
    assert move["to"][2] < 4 and sum(move["to"]) == 12  # the straggler was given less
    assert move["before"]["updates"] == 30 and move["after"]["updates"] == 30
    assert move["update_s_change"] < 0 and move["tokens_per_s_change"] > 0
    assert s["loss"]["first"]["step"] == 1 and s["loss"]["last"]["step"] == 60
    assert s["loss"]["min"]["loss"] <= s["loss"]["last"]["loss"] < s["loss"]["first"]["loss"]
    assert [e["step"] for e in s["evals"]] == [20, 40, 60]
    assert s["events"]["rebalanced"] == 1  # one rebalance of 3 ranks, counted once

    out = io.StringIO()
    render(s, Console(file=out, width=140))
    text = out.getvalue()
    assert "Straggler: rank 2" in text and "Rebalances" in text


def test_report_without_a_slow_rank_has_no_large_straggler(tmp_path):
    synthetic.write_run(tmp_path, world_size=2, slow_rank=None, rebalance_at=None)
    s = summarize(tmp_path)
    assert abs(s["straggler"]["excess"]) < 0.05 and s["rebalances"] == []


def test_report_cli_json_and_errors(tmp_path, capsys):
    synthetic.write_run(tmp_path / "run", world_size=2, steps=10, rebalance_at=5, slow_rank=1)
    assert fleet_main(["report", str(tmp_path / "run"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["straggler"]["rank"] == 1 and len(data["rebalances"]) == 1
    assert fleet_main(["report", str(tmp_path / "run")]) == 0
    assert "Per rank" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert fleet_main(["report", str(tmp_path / "empty")]) == 1
    assert "no telemetry logs" in capsys.readouterr().err
    with pytest.raises(TelemetryError, match="no such run folder"):
        summarize(tmp_path / "missing")


def test_report_reads_as_a_person_would_count_and_measure(tmp_path):
    """Issue 18, defect 12: piped output was cut at 80 columns ("updat…"), 12 MiB read
    "0.01 GiB", and one pause of 4 ranks was counted "paused 4"."""
    import dataclasses
    import subprocess
    import sys

    from tests.support.fleet import fleet_env

    for rank in range(4):
        log = ArrowLog(tmp_path, rank)
        log.directory.mkdir(parents=True, exist_ok=True)
        rows = [dataclasses.replace(synthetic.update(s, rank), peak_mem=12 << 20) for s in (1, 2)]
        log.write([*rows, Event("paused", rank, 2, "paused at update 2")])
        log.write([Event("resumed", rank, 2, "resumed at update 2")])
        log.close()
    piped = subprocess.run(  # stdout is a pipe, as in `fleet report RUN | less`
        [sys.executable, "-m", "fleet.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        env={k: v for k, v in fleet_env().items() if k != "COLUMNS"},
        timeout=60,
    )
    text = piped.stdout
    assert "…" not in text and "updates" in text and "transfer" in text
    assert "12 MiB" in text and "0.01 GiB" not in text
    assert "Events: paused 1, resumed 1" in text


def test_report_into_a_closed_pipe_exits_quietly(tmp_path):
    import subprocess
    import sys

    from tests.support.fleet import fleet_env

    write_batches(tmp_path, 0, range(1, 4))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "report", str(tmp_path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=fleet_env(),
    )
    proc.stdout.close()  # the reader is gone before a byte is written (`... | head -0`)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141
    assert b"Traceback" not in err and err == b""


def test_report_shows_each_rank_s_optimizer_share_and_resident_bytes(tmp_path):
    """--shard-optimizer (issue 20): each rank's share and the master weights + state it
    holds, from the last update it logged; an unsharded run (share 1.0) prints no line."""
    import dataclasses

    from telemetry.units import GiB

    shares = [0.5, 0.25, 0.25]
    for rank, share in enumerate(shares):
        log = ArrowLog(tmp_path, rank)
        log.directory.mkdir(parents=True, exist_ok=True)
        for step in range(1, 4):
            rec = synthetic.update(step, rank)
            log.write([dataclasses.replace(rec, opt_share=share, resident_mem=int(share * GiB))])
        log.close()
    s = summarize(tmp_path)
    assert [r["opt_share"] for r in s["ranks"]] == shares
    assert [r["resident_mem"] for r in s["ranks"]] == [GiB // 2, GiB // 4, GiB // 4]
    out = io.StringIO()
    render(s, Console(file=out, width=160))
    assert "Optimizer sharded" in out.getvalue() and "rank 1 25.0% 256 MiB" in out.getvalue()
    plain = tmp_path / "plain"
    synthetic.write_run(plain, world_size=2, steps=3, slow_rank=None, rebalance_at=None)
    out = io.StringIO()
    render(summarize(plain), Console(file=out, width=160))
    assert "Optimizer sharded" not in out.getvalue()


def test_report_shows_the_tensor_parallel_mode_and_each_rank_s_collectives(tmp_path):
    """Issue 21: the mode from the started event, and per rank the median time of the per-block
    all-reduces and their share of the update; a data-parallel run prints no such columns."""
    import dataclasses

    collectives = [0.030, 0.050]  # rank 1's link is slower: its slice waits longer
    for rank, coll in enumerate(collectives):
        log = ArrowLog(tmp_path, rank)
        log.directory.mkdir(parents=True, exist_ok=True)
        started = {"world_size": 2, "split": [4], "parallel": "tensor", "updates": 5}
        records = [Event("started", rank, 0, "run started", started)]
        for step in range(1, 6):
            rec = synthetic.update(step, rank, compute_s=0.2, wait_s=0.0, transfer_s=0.0)
            records.append(dataclasses.replace(rec, collective_s=coll))
        log.write(records)
        log.close()
    s = summarize(tmp_path)
    assert s["parallel"] == {
        "mode": "tensor",
        "tensor": 2,
        "replicas": 1,
        "text": "tensor (2 ranks a group)",
    }
    assert [r["median_collective_s"] for r in s["ranks"]] == collectives
    update_s = s["ranks"][0]["median_update_s"]
    assert s["ranks"][0]["collective_share"] == pytest.approx(0.030 / update_s)
    out = io.StringIO()
    render(s, Console(file=out, width=160))
    text = out.getvalue()
    assert "parallel: tensor (2 ranks a group); the batch split is fixed" in text
    assert "collective" in text and "coll share" in text
    rank1 = next(line for line in text.splitlines() if line.strip("│ ").startswith("1 "))
    assert "50 ms" in rank1 and f"{0.050 / update_s * 100:.1f}%" in rank1

    plain = tmp_path / "plain"  # an older data-parallel log: no mode recorded, no collectives
    synthetic.write_run(plain, world_size=2, steps=3, slow_rank=None, rebalance_at=None)
    out = io.StringIO()
    render(summarize(plain), Console(file=out, width=160))
    assert "parallel: data\n" in out.getvalue() and "coll share" not in out.getvalue()
