"""What a benchmark or a test starts runs the checkout it belongs to, wherever it is run from
(tests/support/fleet.py): an A/B of two trees must run each tree's trainer."""

from __future__ import annotations

from tests.support.fleet import run_fleet


def test_fleet_runs_this_checkout_from_inside_another(tmp_path):
    """benchmarks/pilot_ab.py ran its other tree's arm from inside this one: `python -m
    fleet.cli` took the working directory's `fleet` before PYTHONPATH's, so both arms of
    every A/B ran one pilot."""
    other = tmp_path / "other-checkout"
    (other / "fleet").mkdir(parents=True)
    (other / "fleet" / "__init__.py").write_text("")
    (other / "fleet" / "cli.py").write_text("print('the other checkout')\n")
    proc = run_fleet("--help", cwd=other)
    assert "the other checkout" not in proc.stdout
    assert "usage: fleet" in proc.stdout + proc.stderr
