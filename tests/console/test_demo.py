"""The demo's commands, and hints that print `fleet` as it can be typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from console import demo

# --- demo commands -----------------------------------------------------------------------------


def test_demo_commands(tmp_path):
    assert demo.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/mlx-fleet")
    assert demo.cache_dir({"HOME": "/h"}) == Path("/h/.cache/mlx-fleet")
    prep = demo.prepare_command(Path("/c"), python="py")
    assert prep[:3] == ["py", "-m", "fleet.cli"]
    assert prep[3:] == [
        "prepare",
        "--stdlib",
        "--max-files",
        "400",
        "--seq-len",
        "128",
        "--out",
        "/c/stdlib-128",
    ]
    launch = demo.launch_command(Path("/c/stdlib-128"), Path("runs/d"), python="py")
    assert launch[3:8] == ["launch", "-n", "4", "--", "train"]
    args = dict(zip(launch[8::2], launch[9::2], strict=False))
    assert args["--local-batches"] == "3,2,2,1"
    assert args["--simulate-slowdown"] == "2,1,1,1"
    assert args["--data"] == "/c/stdlib-128" and args["--run-dir"] == "runs/d"
    assert "--telemetry-port-base" not in launch
    moved = demo.launch_command(Path("d"), Path("r"), port_base=49000)
    assert moved[-2:] == ["--telemetry-port-base", "49000"]
    assert demo.console_args(Path("r"), 4, 49000) == [
        "--local",
        "-n",
        "4",
        "--run-dir",
        "r",
        "--port-base",
        "49000",
    ]
    # issue 18, defect 10: a finite run (it was 100,000 updates: a 32 h ETA, 5,000 warm-up
    # updates), with evaluations for the chart's dots
    assert int(args["--updates"]) == demo.UPDATES <= 5000
    assert float(args["--warmup"]) * demo.UPDATES <= 30 and args["--eval-every"] == "100"
    assert demo.resume_command(Path("runs/d")).endswith(
        "launch -n 4 -- train --resume latest --run-dir runs/d"
    )
    with pytest.raises(ValueError, match="slowdown"):
        demo.launch_command(Path("d"), Path("r"), split=(1, 2), slowdown=(1,))


# --- issue 14: hints print `fleet` as it can be typed ------------------------------------------


def test_fleet_command_is_what_can_be_typed(tmp_path, monkeypatch):
    from console.command import fleet_command, typed

    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")
    script = venv / "fleet"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert fleet_command(str(venv / "python"), cwd=str(tmp_path)) == [".venv/bin/fleet"]
    elsewhere = tmp_path / "elsewhere"
    assert fleet_command(str(venv / "python"), cwd=str(elsewhere)) == [str(script)]
    monkeypatch.setenv("PATH", f"{venv}:/usr/bin")
    assert fleet_command(str(venv / "python"), cwd=str(tmp_path)) == ["fleet"]
    bare = tmp_path / "bare" / "python"
    assert fleet_command(str(bare)) == [str(bare), "-m", "fleet.cli"]
    assert typed(["console", "--replay", "r s"], str(bare)).endswith("console --replay 'r s'")
