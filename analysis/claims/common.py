"""What every claim module shares: the run rows split into kept and dropped, the evidence of a
claim, and the words for our setup. The causes of a difference are in `causes`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List

import pandas as pd

from .. import derive
from ..results import experiment as _all_rows
from ..verdict import Evidence

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


def scaling_words(rows: pd.DataFrame) -> str:
    """Why a baseline's software cost shrinks on the emulated rack, with the run's own s_n; "" when
    its links were not scaled."""
    s_n = pd.to_numeric(rows["s_n"], errors="coerce").dropna() if "s_n" in rows else pd.Series(dtype=float)
    if s_n.empty or s_n.max() <= 1:
        return ""
    return (f"the links run {s_n.max():g}× slower than the paper's while this machine's CPU does not, so the "
            f"software cost behind the paper's value shrinks about {s_n.max():g}-fold beside wire and compute")


def one_machine(rows: pd.DataFrame) -> bool:
    """True when every run shared one machine (loopback or the emulated rack), not a cluster."""
    return not rows.empty and rows["network"].isin(["loopback", "emulated"]).all()


def med(frame: pd.DataFrame, value: str, **where) -> float:
    frame = select(frame, **where)
    return float(frame[value].median()) if not frame.empty else NAN


def order(medians: Dict[str, float]) -> List[str]:
    return [s for s, v in sorted(medians.items(), key=lambda kv: -kv[1]) if not math.isnan(v)]
