"""The one-way package boundaries: telemetry <- trainer, telemetry <- console."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import fleet_env

PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module({pkg!r})
for m in pkgutil.walk_packages(pkg.__path__, {pkg!r} + "."):
    importlib.import_module(m.name)
print(json.dumps(sorted({{n.split(".")[0] for n in sys.modules}})))
"""

FORBIDDEN = {
    "telemetry": {"trainer", "console", "mlx", "textual", "paramiko"},
    "trainer": {"console", "textual", "paramiko"},
    "console": {"trainer", "mlx"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_every_module_of_a_package_never_loads_what_it_must_not(package):
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(pkg=package)],
        env=fleet_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = set(json.loads(out.stdout))
    assert package in loaded
    assert not loaded & FORBIDDEN[package]


def test_import_linter_contracts_hold():
    lint = subprocess.run(
        [sys.executable, "-m", "importlinter.cli", "--no-cache"],
        env=fleet_env(),
        capture_output=True,
        text=True,
    )
    if "No module named" in lint.stderr:
        pytest.skip("import-linter is not installed")
    assert lint.returncode == 0, lint.stdout + lint.stderr
