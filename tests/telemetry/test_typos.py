"""A typo gets one short usage line and the nearest valid name (issue 18, defect 8): flags,
subcommands, TOML config keys and hostfile keys. `--updtes 10` printed 41 lines of usage
before the error, and no "did you mean"."""

from __future__ import annotations

import json

import pytest

from console.hostfile import HostfileError, parse_hostfile
from fleet.cli import main as fleet
from trainer.config import ConfigError, load_file
from trainer.launch.plan import LaunchError, read_hostfile


def refused(capsys, *argv: str) -> list[str]:
    """`fleet ARGV` refused with exit 2; its stderr lines."""
    try:
        code = fleet(list(argv))
    except SystemExit as e:  # argparse exits from parse_args
        code = e.code
    assert code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_a_mistyped_flag_names_the_nearest_one_in_three_lines(capsys):
    lines = refused(capsys, "train", "--data", "d", "--updtes", "10")
    assert lines == [
        "usage: fleet train [options]",
        "fleet train: error: unknown option --updtes (did you mean --updates?)",
        "('fleet train --help' lists every option)",
    ]


def test_a_flag_of_a_subcommand_is_found_there(capsys):
    lines = refused(capsys, "telemetry", "send", "--run-dir", "r", "pause", "--jsn")
    assert "unknown option --jsn (did you mean --json?)" in lines[1] and len(lines) == 3


def test_a_flag_of_another_subcommand_is_not_corrected_into_itself(capsys):
    """`fleet bench throughput --device cpu` once answered "(did you mean --device?)"."""
    lines = refused(capsys, "bench", "throughput", "--device", "cpu")
    assert "unknown option --device (another subcommand takes it, not this one)" in lines[1]


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (("trian",), "unknown command 'trian' (did you mean 'train'?)"),
        (("telemetry", "sned"), "'sned' is not one of tail, send (did you mean 'send'?)"),
        (("telemetry", "send", "--run-dir", "r", "puase"), "(did you mean 'pause'?)"),
        (("bench", "thruput"), "(did you mean 'throughput'?)"),
    ],
)
def test_a_mistyped_subcommand_names_the_nearest_one(capsys, argv, hint):
    lines = refused(capsys, *argv)
    assert len(lines) == 3 and lines[0].startswith("usage: fleet")
    assert hint in lines[1]
    assert "_worker" not in lines[1]  # internal subcommands are not offered


def test_a_far_typo_gets_no_guess(capsys):
    assert refused(capsys, "train", "--zzzzzz", "1")[1].endswith("unknown option --zzzzzz")


def test_a_mistyped_config_key_names_the_nearest_one(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('updtes = 10\ndata = "d"\n')
    with pytest.raises(ConfigError, match=r"unknown key 'updtes' \(did you mean 'updates'\?\)"):
        load_file(toml)
    toml.write_text("local-bach = 4\n")  # in the spelling the file uses
    with pytest.raises(ConfigError, match=r"did you mean 'local-batch'\?"):
        load_file(toml)


def test_a_mistyped_hostfile_key_names_the_nearest_one(tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "mac-a", "ip": ["10.0.0.1"]}]))
    with pytest.raises(LaunchError, match=r"entry 0: unknown key 'ip' \(did you mean 'ips'\?\)"):
        read_hostfile(hosts)
    with pytest.raises(HostfileError, match=r"unknown key 'ip' \(did you mean 'ips'\?\)"):
        parse_hostfile([{"ssh": "mac-a", "ip": ["10.0.0.1"]}])
    hosts.write_text(json.dumps({"host": [{"ssh": "mac-a"}], "backend": "ring"}))
    with pytest.raises(LaunchError, match=r"unknown key 'host' \(did you mean 'hosts'\?\)"):
        read_hostfile(hosts)


def test_the_console_reads_mlx_launchs_object_form_too():
    data = {"backend": "ring", "hosts": [{"ssh": "mac-a", "ips": ["10.0.0.1"]}, {"ssh": "b"}]}
    assert parse_hostfile(data) == [("mac-a", ("10.0.0.1",)), ("b", ())]
