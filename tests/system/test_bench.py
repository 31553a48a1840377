"""`fleet bench telemetry --trainer`: the overhead benchmark times the trainer's real update."""

from __future__ import annotations

import json

import pytest

from telemetry.units import GiB
from tests.support.fleet import run_fleet
from trainer import memory

pytestmark = pytest.mark.slow


def test_telemetry_overhead_on_the_real_update():
    proc = run_fleet(
        *("bench", "telemetry", "--only", "overhead", "--trainer", "--updates", "12", "--json"),
        *("--depth", "1", "--width", "64", "--heads", "2", "--seq-len", "32", "--local-batch", "2"),
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: over 1%, possible on a busy machine
    (name, r), *others = json.loads(proc.stdout)["overhead"].items()
    assert name == "trainer" and others == []  # the stand-ins are not run instead
    assert r["updates_per_arm"] >= 12 and r["median_on_ms"] > 0 and r["median_off_ms"] > 0
    assert r["ok"] == (r["median_diff_pct"] <= 1.0) == (proc.returncode == 0)
    assert r["stalled_dropped"] > 0  # the never-reading subscriber really was attached


TINY = ("--depth", "6", "--width", "64", "--heads", "2", "--seq-len", "128", "--vocab", "256")
BREAKDOWN_KEYS = (
    "weights_bytes",
    "twin_copies_bytes",
    "optimizer_state_bytes",
    "accumulator_bytes",
    "gradient_bytes",
    "loss_head_bytes",
    "resident_bytes",
    "loss_head_peak_bytes",
    "forward_peak_bytes",
    "microbatch_peak_bytes",
    "gradients_held_bytes",
    "compute_peak_bytes",
    "optimizer_peak_bytes",
    "kept_across_updates_bytes",
    "cache_bytes",
    "activations_bytes",
)


def _throughput(*extra: str) -> dict:
    proc = run_fleet(
        *("bench", "throughput", *TINY, "--local-batch", "4", "--updates", "2", "--warmup", "1"),
        *extra,
        "--json",
    )
    return json.loads(proc.stdout)


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_throughput_reports_where_the_peak_goes(precision):
    r = _throughput("--precision", precision)
    m = r["memory"]
    for key in BREAKDOWN_KEYS:
        assert isinstance(m[key], int) and m[key] >= 0, key
    n = r["params"]
    assert m["weights_bytes"] == sum(m["weights_by_dtype"].values()) == 4 * n
    assert m["twin_copies_bytes"] == (2 * n if precision == "mixed" else 0)
    assert m["accumulator_bytes"] == m["gradient_bytes"] == 4 * n
    assert m["optimizer_state_bytes"] >= 8 * n  # AdamW's two moments
    # What the shapes fix is resident, and what is resident is within every phase's peak.
    assert m["resident_bytes"] >= m["weights_bytes"] + m["optimizer_state_bytes"]
    assert m["microbatch_peak_bytes"] >= m["resident_bytes"] + m["gradients_held_bytes"]
    assert m["optimizer_peak_bytes"] >= m["resident_bytes"] + m["accumulator_bytes"]
    assert m["resident_bytes"] < m["compute_peak_bytes"] <= 1.05 * r["peak_bytes"]
    assert abs(m["gradients_held_bytes"] - m["gradient_bytes"]) <= 0.05 * m["gradient_bytes"]
    assert m["kept_across_updates_bytes"] <= 0.05 * m["weights_bytes"]


def test_grad_checkpoint_keeps_fewer_activations():
    """Per-block recomputation, deep and narrow: the activations kept for the backward pass
    are a fraction of what autodiff keeps without it (CPU allocations are deterministic)."""
    plain, ckpt = _throughput(), _throughput("--grad-checkpoint")
    assert ckpt["grad_checkpoint"] and not plain["grad_checkpoint"]
    a, b = plain["memory"]["activations_bytes"], ckpt["memory"]["activations_bytes"]
    assert b < 0.6 * a, (a, b)
    assert ckpt["peak_bytes"] < plain["peak_bytes"]


def test_throughput_reports_the_peak_and_the_live_set():
    """Both side by side. Without a limit (0) the CPU's stream runs ahead and the peak holds
    dead buffers; a limit 5% over the live set brings the peak to it; auto, on the CPU,
    measures the live set and leaves the limit at the machine's share (a limit at the live set
    costs 17-30% of an update there)."""

    def throughput(limit: str) -> dict:
        return _throughput(
            "--vocab", "4096", "--loss-chunk", "32", "--memory-limit-gb", limit, "--no-breakdown"
        )

    unlimited = throughput("0")
    near = f"{1.05 * unlimited['live_set_bytes'] / GiB:.6f}"
    held, default = throughput(near), throughput("auto")
    assert [r["memory_limit"] for r in (unlimited, held, default)] == ["0", near, "auto"]
    for r in (unlimited, held, default):
        assert r["live_set_bytes"] > 0 and r["peak_over_live"] > 0
    assert unlimited["memory_limit_bytes"] is None
    assert held["memory_limit_bytes"] == int(float(near) * GiB)
    assert held["peak_bytes"] < unlimited["peak_bytes"] and held["peak_over_live"] < 1.25
    assert default["memory_limit_bytes"] == memory.machine_budget() > unlimited["peak_bytes"]
    assert default["peak_over_live"] > held["peak_over_live"]  # auto holds nothing on the CPU


def test_cuda_graphs_setting_reaches_the_measuring_process():
    r = _throughput("--cuda-graphs", "off", "--no-breakdown")
    assert r["cuda_graphs"]["MLX_USE_CUDA_GRAPHS"] == "0" and r["memory"] is None


def test_throughput_says_the_device_in_words():
    """Issue 18, defect 14: `bench throughput` printed `Device(cpu, 0)`."""
    proc = run_fleet(
        *("bench", "throughput", *TINY, "--local-batch", "2", "--updates", "1", "--warmup", "1"),
        "--no-breakdown",
    )
    assert "Device(" not in proc.stdout and ", cpu: " in proc.stdout
    assert " MiB (" in proc.stdout  # a small peak reads in MiB, not "0.00 GiB"
