"""What every claim module shares: the run rows split into kept and dropped, the evidence of a
claim, and the words for our setup. The causes of a difference are in `causes`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import pandas as pd

from .. import derive
from ..results import experiment as _all_rows
from ..verdict import Evidence

NAN = float("nan")
PAPER_WORKERS = 8  # the paper's worker count in its end-to-end and scaling charts
SETTING_WORDS = {"cloud10g": "10 Gbps cloud", "ib56g": "56 Gbps InfiniBand"}


@dataclass
class Runs:
    """All run rows, and the evidence of any selection of them. Each experiment's rows and their
    failed-verification mask are split out once (the claims select from them hundreds of times);
    every selection is a new frame, so callers may add columns to it."""
    rows: pd.DataFrame
    _split: Dict[str, tuple] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _experiment(self, name: str) -> tuple:
        if name not in self._split:
            rows = _all_rows(self.rows, name)
            self._split[name] = (rows, derive.failed_verification(rows).to_numpy(dtype=bool))
        return self._split[name]

    def kept(self, name: str, **where) -> pd.DataFrame:
        """The rows of experiment `name` matching `where` that may feed a number."""
        rows, failed = self._experiment(name)
        return rows[matching(rows, **where) & ~failed]

    def evidence(self, name: str, **where) -> Evidence:
        rows, failed = self._experiment(name)
        chosen = matching(rows, **where)
        return Evidence.of(rows[chosen & ~failed], rows[chosen & failed])


def matching(frame: pd.DataFrame, **where) -> np.ndarray:
    """The mask of `frame`'s rows where each column equals the value given, or is in it when a
    list/tuple/set is given."""
    mask = np.ones(len(frame), dtype=bool)
    for column, wanted in where.items():
        values = frame[column]
        equal = values.isin(list(wanted)) if isinstance(wanted, (list, tuple, set)) else values == wanted
        mask &= equal.to_numpy(dtype=bool, na_value=False)  # NA compares as no match, as in boolean indexing
    return mask


def select(frame: pd.DataFrame, **where) -> pd.DataFrame:
    """Rows where each column equals the value given, or is in it when a list/tuple/set is given."""
    return frame[matching(frame, **where)] if where else frame


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
