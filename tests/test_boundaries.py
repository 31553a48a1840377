"""The one-way package boundaries: telemetry <- trainer, telemetry <- console; bench beside
them (it may import all three, nothing imports it); fleet above, importing only its table."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

from tests.support.fleet import fleet_env

PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module({pkg!r})
for m in pkgutil.walk_packages(pkg.__path__, {pkg!r} + "."):
    importlib.import_module(m.name)
{then}
print(json.dumps(sorted({{n.split(".")[0] for n in sys.modules}})))
"""

FORBIDDEN = {
    "telemetry": {"trainer", "console", "mlx", "textual", "paramiko"},
    "trainer": {"console", "textual", "paramiko"},
    "console": {"trainer", "mlx"},
    "trainer.data": {"mlx"},
    "trainer.launch": {"mlx"},
    "trainer.sweep": {"mlx"},
}


@functools.cache
def loaded_by(package: str, then: str = "") -> frozenset[str]:
    """Top-level modules loaded by importing every module of `package` (then running `then`),
    in a fresh interpreter. Cached: each package is walked once per session."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(pkg=package, then=then)],
        env=fleet_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return frozenset(json.loads(out.stdout))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_every_module_of_a_package_never_loads_what_it_must_not(package):
    loaded = loaded_by(package)
    assert package.split(".")[0] in loaded
    assert not loaded & FORBIDDEN[package]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_product_package_loads_the_benchmarks_or_the_dispatcher(package):
    assert not loaded_by(package) & {"bench", "fleet"}


def test_the_benchmarks_load_neither_mlx_nor_textual_until_they_run():
    # Every bench module and `fleet bench`'s whole argument tree: `fleet bench --help` starts
    # fast, and the console benchmark never pays for mlx (nor the memory worker for textual).
    loaded = loaded_by(
        "bench", "import argparse; pkg.cli.configure('bench', argparse.ArgumentParser())"
    )
    assert "bench" in loaded  # and it may import the three packages
    assert not loaded & {"mlx", "textual", "fleet"}


def test_fleet_imports_nothing_at_module_level_but_its_table():
    loaded = loaded_by("fleet")
    assert "fleet" in loaded
    assert not loaded & {*FORBIDDEN, "bench", "mlx", "textual", "paramiko"}


def test_every_subcommand_has_an_owner_with_configure_and_run():
    code = (
        "import importlib, json; from fleet.cli import SUBCOMMANDS\n"
        "print(json.dumps({n: [hasattr(importlib.import_module(m), f) for f in "
        "('configure', 'run')] for n, (m, _) in SUBCOMMANDS.items()}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=fleet_env(), capture_output=True, text=True, check=True
    )
    owners = json.loads(out.stdout)
    assert set(owners) >= {"train", "bench", "console"}
    assert all(v == [True, True] for v in owners.values()), owners


# What the `lint-imports` script runs (`python -m importlinter.cli` has no main: it ran nothing).
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def test_import_linter_contracts_hold():
    lint = subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache"],
        env=fleet_env(),
        capture_output=True,
        text=True,
    )
    if "No module named" in lint.stderr:
        pytest.skip("import-linter is not installed")
    assert lint.returncode == 0, lint.stdout + lint.stderr


# Each contract of pyproject.toml, broken on purpose in a copy of the tree: lint-imports must
# fail and name it (a contract that cannot fail proves nothing).
VIOLATIONS = {
    "data-mlx": (
        {"trainer/data/_violation.py": "import mlx.core\n"},
        "data preparation and reading import no mlx",
    ),
    "data-mlx-through-a-chain": (
        {"trainer/data/_violation.py": "from trainer import step\n"},
        "data preparation and reading import no mlx",
    ),
    "launch-mlx": (
        {"trainer/launch/_violation.py": "import mlx.core\n"},
        "the launcher starts ranks but is none",
    ),
    "sweep-mlx": (
        {"trainer/sweep/_violation.py": "from trainer import builder\n"},
        "the sweep controller starts trials but trains nothing",
    ),
    "wing-imports-the-loop": (
        {"trainer/model/_violation.py": "from trainer import run\n"},
        "the wings sit below the loop",
    ),
    "telemetry-mlx": (
        {"telemetry/_violation.py": "import mlx.core\n"},
        "telemetry is the bottom layer",
    ),
    "console-trainer": (
        {"console/_violation.py": "from trainer import config\n"},
        "console imports neither the trainer nor mlx",
    ),
    "a-circle": (
        {
            "telemetry/_a.py": "from telemetry import _b\n",
            "telemetry/_b.py": "from telemetry import _a\n",
        },
        "no import circles among product modules",
    ),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_a_deliberate_violation_breaks_its_contract(case, tmp_path):
    import shutil

    from tests.support.fleet import ROOT

    files, contract = VIOLATIONS[case]
    for pkg in ("trainer", "telemetry", "console", "bench", "fleet"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, code in files.items():
        (tmp_path / path).write_text(code)
    env = {**fleet_env(), "PYTHONPATH": str(tmp_path)}
    lint = subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    if "No module named" in lint.stderr:
        pytest.skip("import-linter is not installed")
    assert lint.returncode != 0
    broken = " ".join(lint.stdout.split())  # its report wraps long names
    assert f"{contract}" in broken and "BROKEN" in broken, lint.stdout[-2000:]
