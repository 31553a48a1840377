"""`fleet check`: each problem of a fleet gets its own message (fast: facts as the hosts
report them), and a real local group forms and is timed."""

from __future__ import annotations

from telemetry.units import GiB
from trainer.launch.check import HostReport, compare, links_problems

HERE = {"python": "3.11.7", "mlx": "0.32.4", "mlx-fleet": "0.1.0", "dataset": "abc"}


def host(name: str, **facts) -> HostReport:
    base = {**HERE, "dataset": "abc", "disk_free": 100 * GiB, "mem_available": 30 * GiB}
    return HostReport(name, {**base, **facts})


def test_versions_data_disk_and_memory_are_each_named():
    reports = [
        host("studio"),
        host("mini-1", mlx="0.31.0"),
        host("mini-2", dataset=None, dataset_error="FileNotFoundError: dataset.json"),
        host("mini-3", dataset="other"),
        host("mini-4", disk_free=1 * GiB, mem_available=2 * GiB),
    ]
    compare(reports, HERE, need_disk=10 * GiB, need_mem=[4 * GiB] * 5)
    by = {r.name: r.problems for r in reports}
    assert by["studio"] == []
    assert by["mini-1"] == ["mlx 0.31.0, this machine has 0.32.4"]
    assert by["mini-2"] == ["dataset missing or unreadable (FileNotFoundError: dataset.json)"]
    assert by["mini-3"] == ["dataset digest other differs from this machine's abc"]
    assert "1.0 GiB free for checkpoints, needs about 10.0 GiB" in by["mini-4"][0]
    assert "2.0 GiB of memory free, the run expects a peak of about 4.0 GiB" in by["mini-4"][1]


def test_a_group_of_the_wrong_size_and_a_slow_link_are_flagged():
    ranks = [{"rank": r, "size": 1, "in_link_Bps": bw} for r, bw in enumerate([10e9, 9e9, 2e9])]
    problems, warnings = links_problems(ranks, 3)
    assert problems == [
        "the ranks formed group(s) of size [1], not one group of 3 (for JACCL: "
        "is the hostfile in rank order?)"
    ]
    assert "link rank 1 -> rank 2 runs at 2.00 GB/s" in warnings[0]
    assert links_problems([{"rank": 0, "size": 2, "in_link_Bps": 1e9}] * 2, 2) == ([], [])


def test_the_dataset_is_compared_with_this_machine_and_the_odd_ones_out_are_named():
    # a tie between the hosts: this machine's dataset decides (was: whoever differs from host 0)
    reports = [host("a", dataset="old"), host("b", dataset="abc")]
    assert compare(reports, HERE, 0, []) == []
    assert [r.problems for r in reports] == [
        ["dataset digest old differs from this machine's abc"],
        [],
    ]
    # this machine is the odd one out: the majority is named, and so is this machine
    reports = [host("a", dataset="new"), host("b", dataset="new"), host("c", dataset="new")]
    general = compare(reports, HERE, 0, [])
    assert [r.problems for r in reports] == [[], [], []]
    assert general == [
        "this machine: dataset digest abc differs from the majority's new (the run's "
        "checkpoints would name this machine's)"
    ]
    # hosts that split evenly with this machine on neither side: nobody is blamed
    reports = [host("a", dataset="x"), host("b", dataset="y")]
    general = compare(reports, {**HERE, "dataset": None}, 0, [])
    assert [r.problems for r in reports] == [[], []]
    assert general == ["the hosts' datasets differ and no digest has a majority: a x, b y"]
