"""The hostfile and SSH config the console reads."""

from __future__ import annotations

import json

import pytest

from console.hostfile import (
    HostfileError,
    load_hostfile,
    local_targets,
    parse_hostfile,
    rank_targets,
)

# --- hostfile ----------------------------------------------------------------------------------


def test_hostfile_ranks_in_order_and_ports(tmp_path):
    path = tmp_path / "hosts.json"
    path.write_text(
        json.dumps([{"ssh": "studio", "ips": ["10.0.0.1"]}, {"ssh": "mini"}, {"ssh": "studio"}])
    )
    targets = rank_targets(load_hostfile(path), port_base=48000)
    assert [(t.rank, t.host, t.port) for t in targets] == [
        (0, "studio", 48000),
        (1, "mini", 48001),
        (2, "studio", 48002),
    ]
    assert targets[0].ips == ("10.0.0.1",)


@pytest.mark.parametrize(
    "data, match",
    [
        ({"ssh": "a"}, "expected a JSON list"),
        ([], "empty"),
        (["a"], "entry 0.*expected an object"),
        ([{"ssh": "a"}, {"ips": []}], "entry 1.*non-empty host name"),
        ([{"ssh": "a b"}], "not a valid host name"),
        ([{"ssh": "-oProxyCommand=x"}], "not a valid host name"),
        ([{"ssh": "a", "ips": "10.0.0.1"}], "list of address strings"),
    ],
)
def test_hostfile_errors_say_where(data, match):
    with pytest.raises(HostfileError, match=match):
        parse_hostfile(data)


def test_hostfile_file_errors(tmp_path):
    with pytest.raises(HostfileError, match="no such hostfile"):
        load_hostfile(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"ssh": "a"},\n  oops]')
    with pytest.raises(HostfileError, match="line 2 column 3"):
        load_hostfile(bad)
    with pytest.raises(HostfileError, match="outside 1..65535"):
        local_targets(4, port_base=65534)
    with pytest.raises(HostfileError, match="at least 1"):
        local_targets(0)


# --- ssh config resolution ---------------------------------------------------------------------


def test_ssh_config_is_honoured(tmp_path):
    from console.ssh import SSHConfigError, SSHOptions, _parse_hop, host_settings

    cfg = tmp_path / "config"
    cfg.write_text(
        "Host studio\n  HostName 10.0.0.5\n  User ml\n  Port 2222\n  IdentityFile ~/k1\n"
        "  IdentitiesOnly yes\n  ProxyJump bastion\n  StrictHostKeyChecking accept-new\n"
        f"  UserKnownHostsFile {tmp_path}/kh1 {tmp_path}/kh2\n"
        "Host *\n  User fallback\n"
    )
    s = host_settings("studio", SSHOptions(config_path=cfg))
    assert (s.hostname, s.port, s.user) == ("10.0.0.5", 2222, "ml")
    assert s.identity_files[0].endswith("/k1") and not s.identity_files[0].startswith("~")
    assert s.identities_only and s.proxy_jump == "bastion" and s.accept_new
    assert s.known_hosts == tmp_path / "kh1"
    other = host_settings(
        "mini", SSHOptions(config_path=cfg, known_hosts=tmp_path / "kh", user="me")
    )
    assert (other.hostname, other.port, other.user) == ("mini", 22, "me")
    assert other.known_hosts == tmp_path / "kh" and not other.accept_new
    assert _parse_hop("ml@jump:2200") == ("ml", "jump", 2200)
    assert _parse_hop("jump") == (None, "jump", None)
    assert _parse_hop("ssh://u@[::1]:22") == ("u", "::1", 22)
    with pytest.raises(SSHConfigError, match="does not exist"):
        SSHOptions(config_path=tmp_path / "missing").ssh_config()
