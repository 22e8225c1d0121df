"""What a run allows a ratio of times to reach, and the causes the rows show for a difference.

Most of the report's numbers are a ratio of two sets of runs' times: a speedup is the baseline's
time over the system's, a scaling ratio the other system's time over phub's, a point of the chunk
sweep the peak's time over the size's. `TimeRatio` holds the two sides. Each run records its
*floor* (analysis.floors: the larger of its replayed compute and its busiest link's bytes at the
configured rate), so the ratio has a ceiling no system can pass on this testbed: the side under
test at its floor (`TimeRatio.ceiling`). A paper value whose agreement band lies beyond it is not
testable here (verdict.Ceiling).

A cause is named only when the rows show that it moved this number in the direction of the
difference, and by a stated share of the gap (on a log scale: ours / paper). The rules, each
with tests that must fire and tests that must not:

* `off_floor`: a side ran above its floor (`over_floor`), in the direction that moves the ratio
  away from the paper: at its floor the ratio would be closer, by the share given;
* `at_floors`: both sides ran within NEAR_FLOOR of their floors, so the ratio is the ratio of
  the floors (compute or the busiest link's bytes), which the paper's systems were not held to;
* `troubled_runs`: runs that took TCP retransmission timeouts, or lost CPU time to the
  hypervisor, were slower than their point's other runs; without them the number moves toward
  the paper by the share given (none is named when no run can be compared, or the clean runs
  move it away).

A cause that explains less than MIN_SHARE of the gap is not named.

One more rule reads the software-cost experiment (full-size models on unshaped loopback):
`software_hidden`, for the stock PS's non-compute share, names the stock PS's CPU per exchange at
full size when the emulated rack's scaling divides it away and, undivided, it alone would move
the share toward the paper's by the stated share of the gap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional

import pandas as pd

from experiments.monitor import NEAR_FLOOR, STOLEN

from ..normalize import worst
from ..verdict import CAUSE_UNKNOWN, Ceiling, Spread

MIN_SHARE = 0.25  # a cause must explain at least this share of ours / paper (log scale)
STALLED = 1.1  # a troubled run this much slower than its point's clean runs lost time to the trouble
BOUND_WORDS = {"compute": "compute-bound", "wire": "wire-bound", "cpu": "CPU-bound", "other": "bound by neither"}


@dataclass
class Side:
    """The runs of one side of a ratio: one point's repeats (or several points', e.g. 8 workers)."""
    label: str
    rows: pd.DataFrame

    @property
    def seconds(self) -> float:
        return _median(self.rows, "seconds_per_iteration")

    @property
    def floor(self) -> float:
        return _median(self.rows, "floor_seconds")

    @property
    def over(self) -> float:
        """Its median time over its median floor (NaN without a floor)."""
        return self.seconds / self.floor if self.floor and not math.isnan(self.floor) else math.nan

    @property
    def half_range(self) -> float:
        """Half the range of its repeats' times over their median (NaN with fewer than 2)."""
        times = pd.to_numeric(self.rows["seconds_per_iteration"], errors="coerce").dropna() \
            if "seconds_per_iteration" in self.rows else pd.Series(dtype=float)
        return (times.max() - times.min()) / 2 / times.median() if len(times) > 1 and times.median() > 0 else math.nan

    @property
    def floor_kind(self) -> str:
        """What its floor is: "compute" or "wire" (the larger of the two, medians)."""
        compute, wire = _median(self.rows, "compute_floor_seconds"), _median(self.rows, "wire_floor_seconds")
        return "compute" if (compute or 0) >= (0 if math.isnan(wire) else wire) else "wire"

    @property
    def bound(self) -> str:
        """Its worst repeat's bound (normalize.worst), "" when none was recorded."""
        return worst(self.rows["bound"].fillna("")) if "bound" in self.rows else ""

    def describe(self) -> str:
        """E.g. 'stock MXNet ran at 1.38x its floor (wire 0.412 s; bound by neither)'."""
        return (f"{self.label} ran at {self.over:.2f}× its floor ({self.floor_kind} {self.floor:.3g} s; "
                f"{BOUND_WORDS.get(self.bound, 'bound not recorded')})")


@dataclass
class TimeRatio:
    """ours = factor x top's time / bottom's time; `under_test` says which side the claim is about
    ("bottom" for a speedup, where the system under test is the denominator)."""
    top: Side
    bottom: Side
    under_test: str = "bottom"
    factor: float = 1.0

    @property
    def value(self) -> float:
        return self.factor * self.top.seconds / self.bottom.seconds

    def ceiling(self, mechanism: str = "") -> Optional[Ceiling]:
        """The side under test at its floor, the other as measured."""
        if self.under_test == "bottom":
            value, side = self.factor * self.top.seconds / self.bottom.floor, "max"
        else:
            value, side = self.factor * self.top.floor / self.bottom.seconds, "min"
        if math.isnan(value):
            return None
        other = self.top if self.under_test == "bottom" else self.bottom
        test = self.bottom if self.under_test == "bottom" else self.top
        words = f"{other.describe()}; {test.label} at its floor, {test.floor:.3g} s"
        if mechanism:
            words += f"; {mechanism}"
        return Ceiling(value, side, words)

    def spread(self, scale: float = 1.0) -> Optional[Spread]:
        """What the repeats alone move the ratio by: its value times both sides' half-ranges, added
        (times `scale`: 100 for an overhead in percent). None where a side has fewer than 2 repeats."""
        half = self.top.half_range + self.bottom.half_range
        if math.isnan(half):
            return None
        words = (f"the repeats of {self.top.label} lie within {self.top.half_range:.1%} either side of their "
                 f"median, those of {self.bottom.label} within {self.bottom.half_range:.1%}")
        return Spread(scale * self.value * half, words)

    def limits(self, mechanism: str = "") -> dict:
        """A claim's `ceiling` and `spread` for this ratio (Claim(..., **ratio.limits(words)))."""
        return dict(ceiling=self.ceiling(mechanism), spread=self.spread())

    def without(self, drop: Callable[[pd.DataFrame], pd.Series]) -> Optional[float]:
        """ours with the rows `drop` marks left out; None when a side would be left without rows."""
        top, bottom = (s.rows[~drop(s.rows)] for s in (self.top, self.bottom))
        if top.empty or bottom.empty:
            return None
        return self.factor * _median(top, "seconds_per_iteration") / _median(bottom, "seconds_per_iteration")


def share_of_gap(ours: float, paper: float, moved_to: float) -> float:
    """How much of the gap between ours and the paper's value moving ours to `moved_to` closes
    (log scale; negative when it moves away)."""
    gap = math.log(paper / ours)
    return math.log(moved_to / ours) / gap if gap else 0.0


def off_floor(ratio: TimeRatio, paper: float) -> str:
    """A side above its floor that pushed the ratio away from the paper (see the module docstring)."""
    ours, found = ratio.value, []
    for side, at_floor in ((ratio.top, ours / ratio.top.over), (ratio.bottom, ours * ratio.bottom.over)):
        if math.isnan(side.over) or side.over <= NEAR_FLOOR:
            continue
        share = share_of_gap(ours, paper, at_floor)
        if share >= MIN_SHARE:
            found.append(f"{side.describe()}: at its floor the ratio would be {at_floor:.2f} "
                         f"({min(share, 1.0):.0%} of the gap)")
    return "; ".join(found)


def at_floors(ratio: TimeRatio, paper: float) -> str:
    """Both sides within NEAR_FLOOR of their floors: the floors set the ratio."""
    if any(math.isnan(s.over) or s.over > NEAR_FLOOR for s in (ratio.top, ratio.bottom)):
        return ""
    floors = ratio.factor * ratio.top.floor / ratio.bottom.floor
    if share_of_gap(ratio.value, paper, floors) > 0.5:  # the floors themselves are nearer the paper
        return ""
    return (f"both sides ran within {NEAR_FLOOR:g}× their floors ({ratio.top.label} {ratio.top.over:.2f}×, "
            f"{ratio.top.floor_kind} {ratio.top.floor:.3g} s; {ratio.bottom.label} {ratio.bottom.over:.2f}×, "
            f"{ratio.bottom.floor_kind} {ratio.bottom.floor:.3g} s), so the ratio is that of the floors, "
            f"{floors:.2f}: none of the software costs behind the paper's value slowed either here")


TROUBLES = (
    ("tcp_timeouts", lambda rows: pd.to_numeric(rows["tcp_timeouts"], errors="coerce").fillna(0) > 0,
     "TCP retransmission timeouts (at least 200 ms each) on the emulated links"),
    ("cpu_steal", lambda rows: pd.to_numeric(rows["cpu_steal"], errors="coerce").fillna(0) >= STOLEN,
     f"the hypervisor taking {STOLEN:.0%} or more of this machine's CPU time"),
)


def troubled_runs(ratio: TimeRatio, paper: float) -> str:
    """Runs with TCP timeouts or stolen CPU time that slowed their points and moved ours away
    from the paper (see the module docstring)."""
    found = []
    for column, marked, words in TROUBLES:
        if not all(column in s.rows for s in (ratio.top, ratio.bottom)):
            continue
        hit = [marked(s.rows) for s in (ratio.top, ratio.bottom)]
        if not any(h.any() for h in hit):
            continue
        slower = [float(s) / clean for side, h in zip((ratio.top, ratio.bottom), hit)
                  for clean in [side.rows.loc[~h, "seconds_per_iteration"].median()]
                  for s in side.rows.loc[h, "seconds_per_iteration"] if clean and not math.isnan(clean)]
        if not slower or max(slower) < STALLED:
            continue
        clean = ratio.without(marked)
        if clean is None:
            continue
        share = share_of_gap(ratio.value, paper, clean)
        if share >= MIN_SHARE:
            count = sum(int(h.sum()) for h in hit)
            runs = sum(len(s.rows) for s in (ratio.top, ratio.bottom))
            found.append(f"{words} in {count} of {runs} runs, {min(slower):.2f}–{max(slower):.2f}× their points' "
                         f"other runs: without them the ratio would be {clean:.2f} ({min(share, 1.0):.0%} of the gap)")
    return "; ".join(found)


RULES = (troubled_runs, off_floor, at_floors)


def software_hidden(cpu_over_compute: float, cores: int, s_n: float, share: float, paper_share: float) -> str:
    """The stock PS's share of an iteration not spent computing, `share` here, `paper_share` in
    the paper. `cpu_over_compute`: its CPU seconds per exchange at full size (all processes), over
    the model's compute seconds, measured on `cores` cores. On a rack whose links run s_n times
    slower that cost is divided by s_n beside compute (bytes shrink by s_m, compute stretches by
    s_n / s_m); undivided, it alone would make an iteration at least 1 + cpu_over_compute / cores
    compute times long. Named when that moves the share toward the paper's by MIN_SHARE of the
    gap (on the scale of time over compute)."""
    if any(math.isnan(x) for x in (cpu_over_compute, share, paper_share)) or share >= 1 or paper_share >= 1:
        return ""
    ours, paper = 1 / (1 - share), 1 / (1 - paper_share)
    undivided = 1 + cpu_over_compute / cores
    moved = share_of_gap(ours, paper, max(ours, undivided))
    if moved < MIN_SHARE:
        return ""
    return (f"at full size on this machine the stock PS spends {cpu_over_compute:.2g}× the model's compute in CPU "
            f"per exchange (software-cost experiment, {cores} cores); the emulated rack divides that by "
            f"s_n = {s_n:g}, to {cpu_over_compute / s_n:.2g}×; undivided it alone would make the share at least "
            f"{1 - 1 / undivided:.2f} ({min(moved, 1.0):.0%} of the gap)")


def ratio_causes(ratio: Optional[TimeRatio], paper: float) -> str:
    """Every rule's finding for a ratio that differs from `paper`, or CAUSE_UNKNOWN."""
    if ratio is None or not paper or any(s.rows.empty for s in (ratio.top, ratio.bottom)):
        return CAUSE_UNKNOWN
    ours = ratio.value
    if math.isnan(ours) or ours <= 0:
        return CAUSE_UNKNOWN
    found: List[str] = [text for rule in RULES for text in [rule(ratio, paper)] if text]
    return "; ".join(found) if found else CAUSE_UNKNOWN


def _median(rows: pd.DataFrame, column: str) -> float:
    if column not in rows or rows.empty:
        return math.nan
    values = pd.to_numeric(rows[column], errors="coerce").dropna()
    return float(values.median()) if len(values) else math.nan
