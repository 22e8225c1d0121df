"""What every claim module shares: the run rows split into kept and dropped, the evidence of a
claim, the measured causes of a difference, and the words for our setup."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List

import pandas as pd

from experiments.monitor import STOLEN

from .. import derive
from ..results import experiment as _all_rows
from ..verdict import CAUSE_UNKNOWN, Evidence

NAN = float("nan")
PAPER_WORKERS = 8  # the paper's worker count in its end-to-end and scaling charts
SETTING_WORDS = {"cloud10g": "10 Gbps cloud", "ib56g": "56 Gbps InfiniBand"}


@dataclass
class Runs:
    """All run rows, and the evidence of any selection of them."""
    rows: pd.DataFrame

    def kept(self, name: str, **where) -> pd.DataFrame:
        """The rows of experiment `name` matching `where` that may feed a number."""
        rows = select(_all_rows(self.rows, name), **where)
        return rows[~derive.failed_verification(rows)]

    def evidence(self, name: str, **where) -> Evidence:
        rows = select(_all_rows(self.rows, name), **where)
        failed = derive.failed_verification(rows)
        return Evidence.of(rows[~failed], rows[failed])


def select(frame: pd.DataFrame, **where) -> pd.DataFrame:
    """Rows where each column equals the value given, or is in it when a list/tuple/set is given."""
    for column, wanted in where.items():
        if isinstance(wanted, (list, tuple, set)):
            frame = frame[frame[column].isin(list(wanted))]
        else:
            frame = frame[frame[column] == wanted]
    return frame


def causes(rows: pd.DataFrame, paper_workers: int = PAPER_WORKERS) -> str:
    """The measured causes of a difference that the rows themselves show, or CAUSE_UNKNOWN.
    CPU-bound points are added by the claim itself (see verdict.Claim.full_cause)."""
    found: List[str] = []
    if rows.empty:
        return CAUSE_UNKNOWN
    workers = sorted(int(w) for w in rows["workers"].dropna().unique())
    if paper_workers and workers and paper_workers not in workers:
        found.append(f"worker count {', '.join(map(str, workers))}, paper {paper_workers}")
    links = rows.dropna(subset=["link_gbps", "link_gbps_measured"])
    links = links[links["link_gbps"] > 0]
    if not links.empty:
        configured, measured = links["link_gbps"].median(), links["link_gbps_measured"].median()
        if measured < 0.9 * configured:
            found.append(f"links at {configured * 1000:.0f} Mbit/s measured {measured * 1000:.0f}")
    if "link_utilization" in rows:
        used = rows["link_utilization"].dropna()
        if len(used) and used.median() < 0.5:
            found.append(f"busiest link only {used.median():.0%} used")
    for measured in (tcp_stalls(rows), hypervisor_steal(rows)):
        if measured:
            found.append(measured)
    return "; ".join(found) if found else CAUSE_UNKNOWN


STALLED = 1.1  # a run this much slower than its point's runs without the trouble lost time to it


def tcp_stalls(rows: pd.DataFrame) -> str:
    """The TCP retransmission timeouts the rows' runs took on the emulated links, in words, when
    they cost time (see `_cost`); "" otherwise."""
    if "tcp_timeouts" not in rows:
        return ""
    counted = rows.dropna(subset=["tcp_timeouts", "seconds_per_iteration"])
    hit = counted["tcp_timeouts"] > 0
    return _cost(counted, hit, f"TCP retransmission timeouts (at least 200 ms each) on the emulated links in "
                               f"{int(hit.sum())} of {len(counted)} runs, {int(counted['tcp_timeouts'].sum())} in all")


def hypervisor_steal(rows: pd.DataFrame) -> str:
    """The CPU time the hypervisor of a virtual machine took during the rows' runs (`cpu_steal`,
    experiments.monitor), in words, when some run lost at least STOLEN of its cores' time to it
    and that cost time (see `_cost`); "" otherwise, and for runs that did not measure it."""
    if "cpu_steal" not in rows:
        return ""
    counted = rows.dropna(subset=["cpu_steal", "seconds_per_iteration"])
    hit = counted["cpu_steal"] >= STOLEN
    most = counted.loc[hit, "cpu_steal"].max() if hit.any() else 0.0
    return _cost(counted, hit, f"the hypervisor took {STOLEN:.0%} or more of this machine's CPU time in "
                               f"{int(hit.sum())} of {len(counted)} runs (up to {most:.0%})")


def _cost(counted: pd.DataFrame, hit: pd.Series, words: str) -> str:
    """`words` when the runs marked in `hit` lost time to what marked them: some such run took at
    least STALLED times the median of its point's unmarked runs, or none can be compared so (each
    of its point's repeats was marked), with how much slower they were; "" when none is marked or
    every one that can be compared kept its point's pace."""
    if not hit.any():
        return ""
    slower = []
    for _, point in counted.groupby(["experiment", "point"]):
        marked = hit.loc[point.index]
        clean = point.loc[~marked, "seconds_per_iteration"].median()
        slower += [s / clean for s in point.loc[marked, "seconds_per_iteration"] if clean > 0]
    if slower and max(slower) < STALLED:
        return ""
    if slower:
        words += f"; those runs took {min(slower):.2f}–{max(slower):.2f} × their points' runs without"
    return words


def setup(rows: pd.DataFrame) -> str:
    """What our runs for a claim were, in words (for the reason column)."""
    if rows.empty:
        return ""
    counts = sorted(int(w) for w in rows["workers"].dropna().unique())
    workers = f"{counts[0]}–{counts[-1]}" if len(counts) > 3 else ", ".join(str(w) for w in counts)
    networks = ", ".join(sorted(str(n) for n in rows["network"].dropna().unique() if n))
    s_n = sorted(rows["s_n"].dropna().unique())
    scale = f", links scaled down by s_n = {', '.join(f'{s:g}' for s in s_n)}" if s_n else ""
    compute = ", ".join(sorted(str(c) for c in rows["compute"].dropna().unique() if c))
    return f"Ours: {workers} workers on the {networks} network{scale}, compute {compute}."


def one_machine(rows: pd.DataFrame) -> bool:
    """True when every run shared one machine (loopback or the emulated rack), not a cluster."""
    return not rows.empty and rows["network"].isin(["loopback", "emulated"]).all()


def med(frame: pd.DataFrame, value: str, **where) -> float:
    frame = select(frame, **where)
    return float(frame[value].median()) if not frame.empty else NAN


def order(medians: Dict[str, float]) -> List[str]:
    return [s for s, v in sorted(medians.items(), key=lambda kv: -kv[1]) if not math.isnan(v)]
