"""One paper claim compared with our number, and the agreement rule that judges it.

The rule is stated once here (`RULE`), and the report prints it at the top.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

LOW, HIGH = 0.8, 1.25  # ours / paper within this range = agree (symmetric on a log scale)
PERCENT_POINTS = 3.0  # absolute tolerance for overheads in percent

AGREE, DIFFER, NO_DATA, PAPER_ONLY = "agree", "differ", "no data", "paper only"

RULE = f"""\
| kind of number | agree when |
|---|---|
| dimensionless (speedups, ratios of rates or times, shares, relative cost, computed Gbps) \
| {LOW} ≤ ours / paper ≤ {HIGH} |
| overhead in percent | within ±{PERCENT_POINTS:g} percentage points of the paper, or the ratio rule above \
(small overheads are dominated by noise, and chart-read values carry about ±3% of the axis) |
| ordering of systems | the same order over the systems both have |
| a chosen setting (the chunk size at the peak) | the same value |

Otherwise the verdict is **differ**. **no data** means that this run measured nothing for the
claim. **paper only** means that the claim cannot be measured in this reproduction at all.
Counts of workers and absolute rates depend on the machine and on the scaling, so they are
compared with the same ratio rule, and the reason column says why they cannot be expected to match."""

Value = Union[float, Sequence[str], None]


@dataclass
class Claim:
    """A paper claim. `kind` is ratio | percent | order | exact | paper_only.

    `paper` and `ours` are numbers, or for kind=order the system names from first to last.
    `why` explains a verdict of differ, no data or paper only. `note` qualifies any verdict.
    """
    section: str
    claim: str
    paper: Value
    ours: Value
    kind: str = "ratio"
    why: str = ""
    note: str = ""
    unit: str = ""

    @property
    def missing(self) -> bool:
        if self.ours is None:
            return True
        if isinstance(self.ours, (list, tuple)):
            return len(self.ours) < 2
        return isinstance(self.ours, float) and math.isnan(self.ours)

    @property
    def ratio(self) -> Optional[float]:
        if self.kind in ("order", "paper_only") or self.missing or not self.paper:
            return None
        return float(self.ours) / float(self.paper)

    @property
    def verdict(self) -> str:
        if self.kind == "paper_only":
            return PAPER_ONLY
        if self.missing:
            return NO_DATA
        if self.kind == "order":
            common = [s for s in self.paper if s in self.ours]
            return AGREE if len(common) >= 2 and [s for s in self.ours if s in common] == common else DIFFER
        if self.kind == "exact":
            return AGREE if float(self.ours) == float(self.paper) else DIFFER
        within = self.ratio is not None and LOW <= self.ratio <= HIGH
        if self.kind == "percent" and abs(float(self.ours) - float(self.paper)) <= PERCENT_POINTS:
            within = True
        return AGREE if within else DIFFER

    @property
    def reason(self) -> str:
        """The sentence shown beside the verdict."""
        parts = [self.why if self.verdict != AGREE else "", self.note]
        return " ".join(p.strip() for p in parts if p.strip())


def fmt(value: Value, unit: str = "") -> str:
    """A value as the report prints it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, (list, tuple)):
        return " > ".join(value) if value else "—"
    number = f"{float(value):.3g}" if abs(float(value)) < 100 else f"{float(value):,.0f}"
    return f"{number}{unit}"
