"""The paper's claims, each paired with our number (see `verdict.py` for how they are judged).

Every number of ours comes from `derive`, which the figures also use. Every paper number comes
from `analysis/reference/`. One module per part of the report: `pbox` (end-to-end speedups),
`capacity` (cost, capacity, multi-tenancy), `rack` (scaling, beyond one rack, oversubscription),
`micro` (chunk sweep, breakdown, bandwidth per PS) and `context` (paper-only characterization).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import pandas as pd

from ..reference import Table
from ..verdict import Claim
from .capacity import capacity_claims, cost_claims, multitenant_claims, pbox_workers
from .common import Runs
from .context import context_claims
from .micro import bandwidth_claims, breakdown_claims, chunk_claims
from .pbox import speedup_claims
from .rack import cross_rack_claims, oversubscription_claims, scaling_claims

__all__ = ["all_claims", "bandwidth_claims", "breakdown_claims", "capacity_claims", "chunk_claims",
           "context_claims", "cost_claims", "cross_rack_claims", "multitenant_claims", "oversubscription_claims",
           "pbox_workers", "scaling_claims", "speedup_claims"]


def all_claims(runs: pd.DataFrame, ref: Dict[str, Table],
               compute_seconds: Optional[Mapping[str, float]] = None,
               software_cost: Optional[pd.DataFrame] = None) -> List[Claim]:
    """Every claim of the report, in report order. `compute_seconds` feeds the bandwidth rows
    (default: the paper's breakdown chart, see derive.bandwidth_table); `software_cost`, the
    software-cost experiment's rows (results.Results.software_cost), some of the causes."""
    rows = Runs(runs)
    return (speedup_claims(rows, ref) + cost_claims(rows, ref) + capacity_claims(rows, ref)
            + multitenant_claims(rows, ref) + scaling_claims(rows, ref) + cross_rack_claims(rows, ref, software_cost)
            + oversubscription_claims(rows, ref) + chunk_claims(rows, ref) + breakdown_claims(rows, ref, software_cost)
            + bandwidth_claims(ref, compute_seconds) + context_claims(ref))
