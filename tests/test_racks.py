"""The wire bound of the reduce-scatter scheme between racks (analysis.racks), worked by hand, and
the report's section on racks on the wire."""
import math

import pandas as pd
import pytest

from analysis import racks

MB = 1_000_000


def rack_row(**values):
    """One run of the wire series: 1 MB models, no frame headers (chunk_bytes empty), 1 Gbit/s hosts."""
    row = {"experiment": "cross_rack", "system": "phub", "model": "alexnet", "racks": 1, "workers": 2,
           "interfaces": 2, "bytes_per_worker": MB, "link_gbps": 1.0, "chunk_bytes": math.nan,
           "oversubscription": 1.0, "repeat": 0, "seconds_per_iteration": 0.01, "verified": True,
           "verify_kind": "oracle", "bound": "wire", "floor_seconds": 0.008}
    row.update(values)
    return row


def test_one_rack_is_bound_by_a_workers_link():
    assert racks.scheme_bound(rack_row()) == pytest.approx(MB * 8 / 1e9)


def test_two_racks_put_the_exchange_on_the_pbox_interfaces_beside_the_workers_traffic():
    # each PBox interface: (2 workers x M + 2 (R-1)/R x M) / 2 interfaces = 1.5 M at 1 Gbit/s
    assert racks.scheme_bound(rack_row(racks=2, workers=4)) == pytest.approx(1.5 * MB * 8 / 1e9)
    # with PBox interfaces 1.5x faster, the worker's link (M) bounds again
    assert racks.scheme_bound(rack_row(racks=2, workers=4, pbox_link_gbps=1.5)) == pytest.approx(MB * 8 / 1e9)


def test_an_oversubscribed_uplink_bounds_the_exchange_between_racks():
    # 8 racks of 2 workers, uplink 2 x 1 Gbit/s / 8: 2 x 7/8 M each way at 0.25 Gbit/s = 7 M at 1 Gbit/s
    row = rack_row(racks=8, workers=16, oversubscription=8.0, pbox_link_gbps=10.0)
    assert racks.scheme_bound(row) == pytest.approx(7 * MB * 8 / 1e9)
    assert racks.scheme_bound(dict(row, uplink_gbps=1.75)) == pytest.approx(MB * 8 / 1e9)  # the rate given wins


def test_headers_and_compute_raise_the_bound_and_a_missing_rate_gives_nan():
    assert racks.scheme_bound(rack_row(chunk_bytes=3200)) == pytest.approx(1.01 * MB * 8 / 1e9)
    assert racks.scheme_bound(rack_row(compute_floor_seconds=0.5)) == 0.5
    assert math.isnan(racks.scheme_bound(rack_row(link_gbps=math.nan)))


def test_the_report_section_judges_the_wire_series_against_the_scheme_not_the_paper():
    rows = [rack_row(repeat=r, seconds_per_iteration=0.0085) for r in range(3)]
    rows += [rack_row(racks=2, workers=4, repeat=r, seconds_per_iteration=0.0150, floor_seconds=0.0121,
                      cpu_busy=busy) for r, busy in enumerate([0.3, 0.5, 0.4])]
    rows += [rack_row(racks=2, workers=4, simulated_racks=2, seconds_per_iteration=5.0)]  # the other series
    table = racks.wire_rows(pd.DataFrame(rows))
    assert math.isnan(table.iloc[0]["cores_busy"]) and table.iloc[1]["cores_busy"] == pytest.approx(0.4)
    assert list(table["racks"]) == [1, 2]
    two = table.iloc[1]
    assert two["over_scheme"] == pytest.approx(0.0150 / 0.012) and two["overhead_pct"] == pytest.approx(
        (0.0150 / 0.0085 - 1) * 100)
    replayed = racks.replayed_bound(rows[3])
    assert two["replayed"] == pytest.approx(replayed) and two["over_replayed"] == pytest.approx(0.0150 / replayed)
    text = "\n".join(racks.report_lines(pd.DataFrame(rows)))
    met = int(0.0085 / table.iloc[0]["replayed"] <= racks.GOAL) + int(0.0150 / replayed <= racks.GOAL)
    assert f"met at {met} of 2 points" in text
    goal = "met" if 0.0150 / replayed <= racks.GOAL else "missed"
    assert (f"| alexnet | 2 | 4 | 0.015 | +76% | 0.012 | 1.25 | {replayed:.3f} | {0.0150 / replayed:.2f} | 1.01 "
            f"| 40% | wire | {goal} |") in text
    assert racks.report_lines(pd.DataFrame(rows[-1:])) == ["No cross-rack runs with racks on the wire in this run."]


def test_the_scheme_replayed_is_the_racks_exchange_on_the_links_with_no_cpu():
    # 1 MB models at 1 Gbit/s everywhere, no compute: the replay is at least the wire bound, and
    # two racks take longer than one (the trip between racks follows the local sum).
    one = racks.replayed_bound(rack_row(model="synthetic:1", compute="zero"))
    two = racks.replayed_bound(rack_row(model="synthetic:1", compute="zero", racks=2, workers=4))
    assert one >= racks.scheme_bound(rack_row()) * 0.99
    assert two > one
    assert math.isnan(racks.replayed_bound(rack_row(link_gbps=math.nan)))


def test_a_rack_count_whose_repeats_were_mostly_cpu_bound_is_not_judged():
    rows = [rack_row(repeat=r, seconds_per_iteration=0.0085) for r in range(3)]
    rows += [rack_row(racks=2, workers=4, repeat=r, seconds_per_iteration=0.05, bound=b)
             for r, b in enumerate(["cpu", "cpu", "other"])]
    table = racks.wire_rows(pd.DataFrame(rows))
    assert list(table["cpu_bound"]) == [False, True]
    text = "\n".join(racks.report_lines(pd.DataFrame(rows)))
    assert "of 1 points. 1 CPU-bound here (alexnet at 2 racks:" in text
    assert text.rstrip().endswith("| cpu | CPU-bound here |")


def test_a_full_link_on_saturated_cores_is_not_judged_either():
    # the busiest link was full (wire), but the cores were 99% busy: the replay has no CPU
    rows = [rack_row(repeat=r, seconds_per_iteration=0.0085, cpu_busy=0.3) for r in range(3)]
    rows += [rack_row(racks=2, workers=4, repeat=r, seconds_per_iteration=0.05, bound="wire", cpu_busy=busy)
             for r, busy in enumerate([0.99, 0.97, 0.5])]
    table = racks.wire_rows(pd.DataFrame(rows))
    assert list(table["cpu_bound"]) == [False, True]
    assert "| wire | CPU-bound here |" in "\n".join(racks.report_lines(pd.DataFrame(rows)))
    rows[-2]["cpu_busy"] = 0.6  # one repeat of three on saturated cores: judged
    assert list(racks.wire_rows(pd.DataFrame(rows))["cpu_bound"]) == [False, False]
