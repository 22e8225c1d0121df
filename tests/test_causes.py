"""The ceiling of a ratio and the causes of a difference (analysis.claims.causes), on made-up runs:
each rule where it must fire and where it must not (wrong direction, too small a share, nothing
to compare), and a run's floors and bound as the loader judges them (analysis.floors)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import floors
from analysis.claims.causes import MIN_SHARE, Side, TimeRatio, at_floors, off_floor, ratio_causes, troubled_runs
from analysis.verdict import AGREE, CAUSE_UNKNOWN, DIFFER, NOT_TESTABLE, Ceiling, Claim, Evidence


def side(label, seconds, floor, bound="other", **columns):
    """Repeats of one point taking `seconds` (one per repeat) over a wire floor of `floor`."""
    rows = pd.DataFrame({"seconds_per_iteration": seconds, "floor_seconds": floor, "wire_floor_seconds": floor,
                         "compute_floor_seconds": 0.0, "bound": bound, "experiment": "pbox", "point": label,
                         **columns})
    return Side(label, rows)


def speedup(base_seconds, system_seconds, base_floor=1.0, system_floor=1.0, **columns):
    """stock's time / the system's: the system under test is the bottom side."""
    return TimeRatio(side("stock", base_seconds, base_floor, **columns.get("base", {})),
                     side("phub", system_seconds, system_floor, **columns.get("system", {})))


def test_a_speedup_is_capped_by_the_system_at_its_floor():
    ratio = speedup([2.0] * 3, [1.5] * 3, base_floor=1.6, system_floor=1.0)
    ceiling = ratio.ceiling("links scaled")
    assert ratio.value == pytest.approx(2.0 / 1.5)
    assert ceiling.value == pytest.approx(2.0) and ceiling.side == "max" and "links scaled" in ceiling.mechanism
    assert "stock ran at 1.25× its floor" in ceiling.mechanism
    # a time ratio of the system under test over the baseline has a floor instead
    low = TimeRatio(ratio.bottom, ratio.top, under_test="top").ceiling()
    assert low.value == pytest.approx(1.0 / 2.0) and low.side == "min"


@pytest.mark.parametrize("paper, verdict", [
    (3.0, NOT_TESTABLE),  # needs >= 2.4, the run allows at most 2.0
    (2.4, DIFFER),  # needs >= 1.92: the run could have reached it, and did not
    (1.5, AGREE),
])
def test_a_paper_value_beyond_the_ceiling_is_not_testable(paper, verdict):
    ratio = speedup([2.0] * 3, [1.5] * 3, base_floor=1.6, system_floor=1.0)
    claim = Claim("s", "c", paper, ratio.value, ceiling=ratio.ceiling("why"), cause=CAUSE_UNKNOWN,
                  evidence=Evidence(bounds={"other": 2}))
    assert claim.verdict == verdict and claim.measured == (verdict != NOT_TESTABLE)
    if verdict == NOT_TESTABLE:
        assert "Not testable here: this run allows at most 2" in claim.reason and "needs ≥ 2.4" in claim.reason
        assert not claim.problems()


def test_a_ceiling_that_leaves_part_of_the_band_keeps_the_row_testable():
    assert not Ceiling(0.9, "max", "m").excludes(0.8, 1.25) and Ceiling(0.7, "max", "m").excludes(0.8, 1.25)
    assert Ceiling(1.3, "min", "m").excludes(0.8, 1.25) and not Ceiling(1.2, "min", "m").excludes(0.8, 1.25)
    assert not Ceiling(math.nan, "max", "m").excludes(0.8, 1.25)


def test_off_floor_names_the_system_that_ran_above_its_floor_when_ours_is_too_low():
    ratio = speedup([2.0] * 3, [1.6] * 3, base_floor=2.0, system_floor=1.0)  # ours 1.25, paper 2.0
    found = off_floor(ratio, 2.0)
    assert "phub ran at 1.60× its floor" in found and "at its floor the ratio would be 2.00 (100% of the gap)" in found


def test_off_floor_does_not_name_a_side_whose_floor_would_move_ours_away():
    # ours 1.25 is below the paper's 2.0; the baseline above its floor made ours *higher*: not a cause
    ratio = speedup([2.0] * 3, [1.6] * 3, base_floor=1.0, system_floor=1.6)
    assert off_floor(ratio, 2.0) == ""
    # ours above the paper's: the same baseline is the cause
    assert "stock ran at 2.00× its floor" in off_floor(ratio, 1.0)


def test_off_floor_needs_a_stated_share_of_the_gap():
    # phub at 1.12x its floor closes log(1.12) / log(4) = 8% of a 4x gap: below MIN_SHARE
    ratio = speedup([1.0] * 3, [1.12] * 3, base_floor=1.0, system_floor=1.0)
    assert math.log(1.12) / math.log(4 / ratio.value) < MIN_SHARE
    assert off_floor(ratio, 4.0) == ""


def test_at_floors_says_the_floors_set_a_ratio_of_two_points_at_them():
    ratio = speedup([1.02] * 3, [1.01] * 3, base_floor=1.0, system_floor=1.0)
    found = at_floors(ratio, 2.5)
    assert "both sides ran within 1.1× their floors" in found and "the ratio is that of the floors, 1.00" in found
    assert at_floors(speedup([1.5] * 3, [1.01] * 3), 2.5) == ""  # the baseline was far above its floor


def troubled(top_seconds, top_timeouts, bottom_seconds, bottom_timeouts):
    return TimeRatio(side("stock", top_seconds, 1.0, tcp_timeouts=top_timeouts, cpu_steal=0.0),
                     side("phub", bottom_seconds, 1.0, tcp_timeouts=bottom_timeouts, cpu_steal=0.0))


def test_timeouts_are_named_when_the_runs_that_took_them_moved_ours_away_from_the_paper():
    # two of phub's three repeats stalled: its median is a stalled run, and ours too low
    ratio = troubled([2.0] * 3, [0, 0, 0], [1.0, 1.6, 1.6], [0, 2, 3])
    found = troubled_runs(ratio, 2.0)
    assert "TCP retransmission timeouts" in found and "in 2 of 6 runs, 1.60–1.60× their points' other runs" in found
    assert "without them the ratio would be 2.00 (100% of the gap)" in found


def test_timeouts_are_not_named_when_the_median_run_took_none():
    ratio = troubled([2.0] * 3, [0, 0, 0], [1.0, 1.0, 1.6], [0, 0, 3])
    assert troubled_runs(ratio, 3.0) == ""


def test_timeouts_are_not_named_when_the_slowed_runs_moved_ours_toward_the_paper():
    # the baseline's stalled runs *raised* the speedup; ours is below the paper's anyway
    ratio = troubled([2.0, 3.0, 3.0], [0, 4, 4], [1.0] * 3, [0, 0, 0])
    assert troubled_runs(ratio, 4.0) == ""
    assert "without them the ratio would be 2.00" in troubled_runs(ratio, 2.0)  # ours too high: named


def test_timeouts_are_not_named_when_no_run_is_left_to_compare_or_none_cost_time():
    everywhere = troubled([2.0] * 3, [0, 0, 0], [1.6] * 3, [1, 1, 1])  # every repeat of phub took one
    assert troubled_runs(everywhere, 2.0) == ""
    harmless = troubled([2.0] * 3, [0, 0, 0], [1.0, 1.0, 1.02], [0, 1, 1])  # 1.02x: they cost no time
    assert troubled_runs(harmless, 3.0) == ""


def test_stolen_cpu_time_follows_the_same_rule():
    ratio = TimeRatio(side("stock", [2.0] * 3, 1.0, cpu_steal=0.0, tcp_timeouts=0),
                      side("phub", [1.0, 1.5, 1.5], 1.0, cpu_steal=[0.0, 0.2, 0.3], tcp_timeouts=0))
    assert "the hypervisor taking 5% or more" in troubled_runs(ratio, 2.0)


def test_ratio_causes_says_unknown_when_no_rule_fires():
    ratio = speedup([1.5] * 3, [1.0] * 3, base_floor=1.0, system_floor=0.5)  # phub 2x over its floor: named
    assert "phub ran at 2.00×" in ratio_causes(ratio, 3.0)
    quiet = speedup([1.5] * 3, [1.0] * 3, base_floor=1.5, system_floor=1.0)  # stock at its floor, phub too
    assert ratio_causes(quiet, 1.0) != CAUSE_UNKNOWN  # the floors decide
    # ours 1.43 under the paper's 3: phub is at its floor, and the baseline's distance from its own
    # floor raised ours; no rule holds
    assert ratio_causes(speedup([1.5] * 3, [1.05] * 3, base_floor=1.0, system_floor=1.0), 3.0) == CAUSE_UNKNOWN
    assert ratio_causes(None, 2.0) == CAUSE_UNKNOWN


def _run(**values):
    base = {"experiment": "pbox", "model": "alexnet", "compute": "replay", "variant": "full", "s_t": 0.5,
            "seconds_per_iteration": 1.0, "cpu_busy": 0.3, "busiest_process_cpu": 0.2, "link_utilization": 0.5,
            "bound": ""}
    base.update(values)
    return base


def test_old_rows_get_their_floors_and_a_bound_judged_against_them():
    from experiments.models import compute_profile

    compute = compute_profile("alexnet").seconds_per_iteration / 0.5  # the replay's, stretched by 1 / s_t
    rows = floors.settle(pd.DataFrame([
        _run(), _run(link_utilization=0.9, bound="mixed"), _run(seconds_per_iteration=compute * 1.05),
        _run(compute="zero", cpu_busy=0.9), _run(cpu_busy=math.nan, busiest_process_cpu=math.nan, bound="mixed"),
        _run(cpu_busy=math.nan, busiest_process_cpu=math.nan, bound="wire")]))
    assert rows["compute_floor_seconds"].iloc[0] == pytest.approx(compute)
    assert rows["wire_floor_seconds"].iloc[0] == pytest.approx(0.5)  # utilization x seconds
    assert rows["floor_seconds"].iloc[0] == pytest.approx(max(compute, 0.5))
    assert list(rows["bound"]) == ["other", "wire", "compute", "cpu", "other", "wire"]
    assert rows["compute_floor_seconds"].iloc[3] == 0.0


def test_the_stock_software_cost_divided_away_is_named_where_it_alone_closes_the_gap():
    from analysis.claims.causes import software_hidden

    # 12x compute in CPU on 2 cores: undivided, an iteration takes at least 7x compute (share 0.86)
    found = software_hidden(12.0, 2, 1120.0, 0.41, 0.78)
    assert "spends 12× the model's compute" in found and "to 0.011×" in found and "at least 0.86" in found
    assert software_hidden(0.2, 2, 1120.0, 0.41, 0.78) == ""  # 1.1x compute: too little to close 25% of it
    assert software_hidden(12.0, 2, 1120.0, 0.90, 0.78) == ""  # ours above the paper's: the wrong direction
    assert software_hidden(float("nan"), 2, 1120.0, 0.41, 0.78) == ""
