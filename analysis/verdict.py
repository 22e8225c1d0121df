"""One paper claim compared with our number, and the agreement rule that judges it.

The rule is stated once here (`RULE`), and the report prints it at the top. Every row is exactly
one of five verdicts: measured **agree**, measured **differ**, **no data**, **paper only** and
**derived**. Only the two measured verdicts count as a measurement (`Claim.measured`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

import pandas as pd

from experiments.monitor import CPU_BOUND, LINK_FULL, NEAR_FLOOR

LOW, HIGH = 0.8, 1.25  # ours / paper within this range = agree (symmetric on a log scale)
PERCENT_RELATIVE = 0.5  # overheads in percent: agree within ±50% of the paper's value
PERCENT_AT_ZERO = 0.5  # ... and, only where the paper's value is 0, within ±0.5 percentage points

AGREE, DIFFER, NO_DATA, PAPER_ONLY, DERIVED = "agree", "differ", "no data", "paper only", "derived"
NOT_TESTABLE = "not testable here"
VERDICTS = (AGREE, DIFFER, NOT_TESTABLE, NO_DATA, PAPER_ONLY, DERIVED)
MEASURED, DERIVED_BASIS = "measured", "derived"  # where `ours` comes from
CPU_MARK = "CPU-bound here: not comparable"
CAUSE_UNKNOWN = "cause unknown"
# The worst bound of a point's repeats wins: a CPU-bound repeat says most about this machine,
# a compute-bound one least (experiments.monitor.classify).
BOUND_ORDER = ("cpu", "other", "wire", "compute", "unknown")

RULE = f"""\
| kind of number | agree when |
|---|---|
| dimensionless (speedups, ratios of rates or times, shares, relative cost, computed Gbps) \
| {LOW} ≤ ours / paper ≤ {HIGH} |
| overhead in percent | \\|ours − paper\\| ≤ {PERCENT_RELATIVE:g} × paper (and \\|ours\\| ≤ \
{PERCENT_AT_ZERO:g} points where the paper's value is 0) |
| a lower bound the paper implies ("at least") | ours ≥ {LOW} × the bound |
| ordering of systems | the same order over the systems both have |
| a chosen setting (the chunk size at the peak) | the same value |

Overheads get a wider band than ratios because a few percent of overhead is close to the noise
of one iteration time, but the band is relative, with no absolute floor: an overhead of 0 can
never agree with the paper's 0.4%, so a run that cannot see the overhead at all does not pass.

Verdicts: **agree** / **differ** compare a number this run measured (possibly through a stated
model) with the paper's. **not testable here** is a measured number that could not have agreed
whatever the system under test did: each run has a *floor* (the larger of its replayed compute and
its busiest link's bytes at the configured rate), and the best the run allows (the baseline's
time over the system's floor, for a speedup) lies short of the agreement band around the paper's
value; the row gives that ceiling and what sets it, and does not count as measured. So is a number
that its repeats alone could move across an edge of the agreement band (ours ± its *spread*, said
with the repeats it comes from): agree or differ there would be the luck of the repeats. Every
**differ** names its cause: one the rows show moved this number in the direction of the
difference, with its share of the gap, or "{CAUSE_UNKNOWN}". **derived** rows are computed from the
paper's own numbers, or from our measurement plus a stated model; they show the computation and
how it compares, but never count as measured. **no data** means that this run measured nothing
for the claim (the reason says what is missing). **paper only** means that the claim cannot be
measured in this reproduction at all.
The *bound* column says what set the pace of each measured point (its worst repeat), judged
against its floor: `compute` (within {NEAR_FLOOR:g}× its replayed compute), `wire` (its busiest
link ran at ≥ {LINK_FULL:.0%} of its rate), `cpu` (this machine's cores or one process were
≥ {CPU_BOUND:.0%} busy) or `other` (nothing ran full, yet the point was slower than its floor:
latency, stalls, the protocol). A row that uses a `cpu` point says "{CPU_MARK}": its verdict is
kept but says nothing about the paper's system. Runs that failed verification (verify_kind oracle
or workers_agree) are left out of every number, and the row says how many were dropped; runs with
nothing to verify are kept, and the row says so. Counts of workers and absolute rates depend on the
machine and on the scaling, so they are compared with the same ratio rule, and the reason column
says why they cannot be expected to match."""

Value = Union[float, Sequence[str], None]


@dataclass
class Evidence:
    """The run rows behind one measured claim: what bounded its points, and what was left out."""
    bounds: Dict[str, int] = field(default_factory=dict)  # points by bound (BOUND_ORDER)
    cpu_points: List[str] = field(default_factory=list)
    other_points: List[str] = field(default_factory=list)
    dropped: int = 0  # runs that failed verification
    unverifiable: int = 0  # runs with nothing to verify (verify_kind "none")
    unchecked: int = 0  # runs with verified false and no verify_kind (older files): kept

    @classmethod
    def of(cls, kept: pd.DataFrame, dropped: Optional[pd.DataFrame] = None) -> "Evidence":
        """Evidence from the rows a claim uses (`kept`) and those it lost to verification."""
        out = cls(dropped=0 if dropped is None else len(dropped))
        if kept.empty:
            return out
        bound = kept["bound"].fillna("") if "bound" in kept else pd.Series("", index=kept.index)
        bound = bound.where(bound.isin(BOUND_ORDER), "unknown")
        points = _points(kept).assign(rank=bound.map({b: i for i, b in enumerate(BOUND_ORDER)}))
        worst = points.groupby("key").agg(name=("name", "first"), rank=("rank", "min"))
        for point_name, r in zip(worst["name"], worst["rank"]):
            b = BOUND_ORDER[int(r)]
            out.bounds[b] = out.bounds.get(b, 0) + 1
            if b == "cpu":
                out.cpu_points.append(point_name)
            elif b == "other":
                out.other_points.append(point_name)
        if "verify_kind" in kept:
            out.unverifiable = int((kept["verify_kind"] == "none").sum())
            out.unchecked = int(((kept["verify_kind"].fillna("") == "") & (kept["verified"] == False))  # noqa: E712
                                .fillna(False).astype(bool).sum())
        return out

    @property
    def points(self) -> int:
        return sum(self.bounds.values())

    def column(self) -> str:
        """The report's bound column, e.g. 'wire (12)' or 'cpu 3 / other 1 / wire 8'."""
        present = [(b, self.bounds[b]) for b in BOUND_ORDER if self.bounds.get(b)]
        if not present:
            return "—"
        if len(present) == 1:
            return f"{present[0][0]} ({present[0][1]})"
        return " / ".join(f"{b} {n}" for b, n in present)

    def notes(self, bounds: bool = True) -> List[str]:
        """The sentences the reason column carries for these rows (without what bounded them when
        `bounds` is False: a derived row's inputs, e.g. a calibration that measures the CPU itself)."""
        out = []
        if bounds and self.cpu_points:
            out.append(f"{CPU_MARK} ({len(self.cpu_points)} of {self.points} points: {_names(self.cpu_points)}).")
        if bounds and self.other_points:
            out.append(f"Points slower than their floor with nothing full (other): {_names(self.other_points)}.")
        if bounds and self.bounds.get("unknown"):
            out.append(f"Bound not recorded for {self.bounds['unknown']} of {self.points} points.")
        if self.dropped:
            out.append(f"{self.dropped} run(s) dropped: they failed verification.")
        if self.unverifiable:
            out.append(f"{self.unverifiable} run(s) had nothing to verify (not verifiable).")
        if self.unchecked:
            out.append(f"{self.unchecked} run(s) not verified, and their file does not say whether verification "
                       "applied (no verify_kind): kept.")
        return out


# A point is one configuration of an experiment; its rows are the repeats.
POINT_KEYS = ("experiment", "point", "source_file", "system", "model", "setting", "workers", "racks",
              "interfaces", "chunk_bytes", "oversubscription", "variant", "job")


def _points(rows: pd.DataFrame) -> pd.DataFrame:
    """Per row: `key`, the same for the repeats of one point, and `name`, how the report names it
    (the experiment and its `point` column, with the configuration columns that vary when `point`
    does not tell the points apart)."""
    keys = [k for k in POINT_KEYS if k in rows]
    key = rows[keys].astype(str).agg("|".join, axis=1)
    point = rows["point"].fillna("").astype(str) if "point" in rows else pd.Series("", index=rows.index)
    name = rows["experiment"].astype(str) + "/" + point.where(point != "", "point")
    if pd.DataFrame({"key": key, "name": name}).groupby("name")["key"].nunique().max() > 1:
        varying = [k for k in keys if k not in ("experiment", "point", "source_file")
                   and rows[k].astype(str).nunique() > 1]
        for k in varying:
            name = name + f" {k}=" + rows[k].astype(str)
    return pd.DataFrame({"key": key, "name": name})


def _names(points: List[str], most: int = 4) -> str:
    shown = ", ".join(points[:most])
    return shown + (f" and {len(points) - most} more" if len(points) > most else "")


@dataclass(frozen=True)
class Ceiling:
    """The best value of a claim's number that this run allows, whatever the system under test
    does: with `side` "max" the number can be at most `value` (a speedup: the baseline's time over
    the system's floor), with "min" at least `value` (the system's time over the baseline's: its
    floor over the baseline's time). `mechanism` says in words what sets it, with its figures."""
    value: float
    side: str  # "max" | "min"
    mechanism: str

    def excludes(self, low: float, high: float) -> bool:
        """True when no value this run allows lies in [low, high] (the agreement band)."""
        if math.isnan(self.value):
            return False
        return self.value < low if self.side == "max" else self.value > high


@dataclass
class Spread:
    """How far this run's repeats alone move a claim's number: ± `value` in the claim's unit (for
    a ratio of two points' medians, each point's half-range over its median, added). `mechanism`
    says from which repeats, with their figures."""
    value: float
    mechanism: str

    def straddles(self, ours: float, low: float, high: float) -> bool:
        """True when ours ± the spread reaches across an edge of the agreement band [low, high]."""
        if math.isnan(self.value) or math.isnan(ours):
            return False
        below, above = ours - self.value, ours + self.value
        return any(below < edge < above for edge in (low, high) if not math.isinf(edge))


@dataclass
class Claim:
    """A paper claim. `kind` is ratio | percent | at_least | order | exact | paper_only.

    `paper` and `ours` are numbers, or for kind=order the system names from first to last; for
    kind=exact `ours` may be a word where the run has no number to give (compared as unequal).
    `basis` says where ours comes from: "measured" (this run) or "derived" (the paper's numbers,
    or our measurement plus the model stated in `method`). `why` explains a verdict of differ,
    no data or paper only; `cause` is a differ's cause (a measured one or CAUSE_UNKNOWN); `note`
    qualifies any verdict. `evidence` holds the run rows behind a measured claim. `ceiling`, where
    the claim can compute one, is the best this run allows; a measured differ whose agreement band
    lies wholly beyond it is **not testable here**; so is a measured verdict whose `spread` (what
    the repeats alone move the number by) reaches across an edge of the agreement band.
    """
    section: str
    claim: str
    paper: Value
    ours: Value
    kind: str = "ratio"
    why: str = ""
    note: str = ""
    unit: str = ""
    basis: str = MEASURED
    method: str = ""
    cause: str = ""
    evidence: Optional[Evidence] = None
    ceiling: Optional[Ceiling] = None
    spread: Optional[Spread] = None

    @property
    def missing(self) -> bool:
        if self.ours is None:
            return True
        if isinstance(self.ours, (list, tuple)):
            return len(self.ours) < 2
        return isinstance(self.ours, float) and math.isnan(self.ours)

    @property
    def ratio(self) -> Optional[float]:
        if self.kind in ("order", "paper_only") or self.missing or not self.paper or isinstance(self.ours, str):
            return None
        return float(self.ours) / float(self.paper)

    @property
    def comparison(self) -> Optional[str]:
        """AGREE or DIFFER by the rule, whatever the basis; None when there is nothing to compare."""
        if self.kind == "paper_only" or self.missing or self.paper is None:
            return None
        if self.kind == "order":
            common = [s for s in self.paper if s in self.ours]
            return AGREE if len(common) >= 2 and [s for s in self.ours if s in common] == common else DIFFER
        if self.kind == "exact":  # numbers, or a word where ours has none (a flat sweep's peak)
            return AGREE if self.ours == self.paper else DIFFER
        ours, paper = float(self.ours), float(self.paper)
        if self.kind == "percent":
            band = PERCENT_RELATIVE * abs(paper) if paper else PERCENT_AT_ZERO
            return AGREE if abs(ours - paper) <= band else DIFFER
        if self.kind == "at_least":
            return AGREE if ours >= LOW * paper else DIFFER
        return AGREE if self.ratio is not None and LOW <= self.ratio <= HIGH else DIFFER

    @property
    def band(self) -> Optional[tuple]:
        """The values of ours that would agree, (low, high); None for kinds without a numeric band."""
        if self.kind not in ("ratio", "percent", "at_least") or self.paper is None:
            return None
        paper = float(self.paper)
        if self.kind == "percent":
            width = PERCENT_RELATIVE * abs(paper) if paper else PERCENT_AT_ZERO
            return paper - width, paper + width
        if self.kind == "at_least":
            return LOW * paper, math.inf
        return LOW * paper, HIGH * paper

    @property
    def testable(self) -> bool:
        """False when the run's ceiling leaves no value in the agreement band."""
        band = self.band
        return self.ceiling is None or band is None or not self.ceiling.excludes(*band)

    @property
    def resolvable(self) -> bool:
        """False when the repeats alone could move the number across an edge of the agreement band."""
        band = self.band
        return (self.spread is None or band is None or not isinstance(self.ours, (int, float))
                or not self.spread.straddles(float(self.ours), *band))

    @property
    def limit(self) -> Union[Ceiling, Spread, None]:
        """What makes a measured comparison not testable here: the ceiling, for a differ whose band
        lies wholly beyond it, else the spread, where the repeats could move ours across the band's
        edge; None when neither does."""
        comparison = self.comparison
        if comparison == DIFFER and not self.testable:
            return self.ceiling
        if comparison in (AGREE, DIFFER) and not self.resolvable:
            return self.spread
        return None

    @property
    def verdict(self) -> str:
        if self.kind == "paper_only":
            return PAPER_ONLY
        if self.missing:
            return NO_DATA
        if self.basis == DERIVED_BASIS:
            return DERIVED
        return NOT_TESTABLE if self.limit is not None else self.comparison or NO_DATA

    @property
    def measured(self) -> bool:
        return self.verdict in (AGREE, DIFFER)

    @property
    def full_cause(self) -> str:
        """A differ's cause as the claim code found it (analysis.claims.causes): measured, or
        CAUSE_UNKNOWN."""
        return self.cause.strip()

    @property
    def bound(self) -> str:
        return self.evidence.column() if self.evidence is not None and self.basis == MEASURED else "—"

    @property
    def reason(self) -> str:
        """The sentence shown beside the verdict."""
        verdict = self.verdict
        parts = [self.why if verdict != AGREE else ""]
        if verdict == DIFFER:
            cause = self.full_cause
            parts.append("" if not cause else "Cause unknown." if cause == CAUSE_UNKNOWN else f"Cause: {cause}.")
        if verdict == NOT_TESTABLE and isinstance(self.limit, Spread):
            low, high = self.band
            parts.append(f"Not testable here: the repeats alone move this number by ±{fmt(self.spread.value, self.unit)} "
                         f"({self.spread.mechanism}), across an edge of the agreement band, "
                         f"{fmt(low, self.unit)} to {fmt(high, self.unit)}.")
        elif verdict == NOT_TESTABLE:
            low, high = self.band
            needs = f"≥ {fmt(low, self.unit)}" if self.ceiling.side == "max" else f"≤ {fmt(high, self.unit)}"
            most = "at most" if self.ceiling.side == "max" else "at least"
            parts.append(f"Not testable here: this run allows {most} {fmt(self.ceiling.value, self.unit)} "
                         f"({self.ceiling.mechanism}); agreeing with the paper needs {needs}.")
        if verdict == DERIVED:
            parts.append(f"Derived: {self.method}" if self.method else "Derived.")
            ratio = f" (ours / paper {self.ratio:.2f})" if self.ratio is not None else ""
            parts.append(f"By the rule it would {self.comparison}{ratio}, but it is not a measurement.")
        if self.evidence is not None:
            parts += self.evidence.notes(bounds=self.basis == MEASURED)
        parts.append(self.note)
        return " ".join(p.strip() for p in parts if p and p.strip())

    def problems(self) -> List[str]:
        """What makes this row's verdict unsupported (empty: nothing): a measured verdict without
        run rows behind it, a derived row without its method, a differ without a cause, a row that
        uses CPU-bound points and does not say so."""
        out = []
        verdict = self.verdict
        if verdict in (AGREE, DIFFER) and (self.evidence is None or self.evidence.points == 0):
            out.append("has a measured verdict but no run rows behind it")
        if verdict == DERIVED and not self.method.strip():
            out.append("is derived but does not state how")
        if verdict == DIFFER and not self.full_cause:
            out.append(f"differs without a cause (a measured one or {CAUSE_UNKNOWN!r})")
        if verdict == NOT_TESTABLE and not self.limit.mechanism.strip():
            out.append("is not testable here without saying what sets its ceiling or spread")
        if self.evidence is not None and self.evidence.cpu_points and self.basis == MEASURED \
                and verdict in (AGREE, DIFFER) and CPU_MARK not in self.reason:
            out.append(f"uses CPU-bound points without saying {CPU_MARK!r}")
        return out


def fmt(value: Value, unit: str = "") -> str:
    """A value as the report prints it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return " > ".join(value) if value else "—"
    number = f"{float(value):.3g}" if abs(float(value)) < 100 else f"{float(value):,.0f}"
    return f"{number}{unit}"
