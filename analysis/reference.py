"""The paper's numbers (the CSVs in `analysis/reference/`) and how its system names map to ours.

Every reference CSV carries `#` lines with its provenance; `load()` keeps them next to the data so
figures and the report can quote where a number came from.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"

# The paper's system names -> ours. None: the paper's system has no counterpart here (MXNet over
# InfiniBand needs RDMA hardware; Gloo's halving-doubling allreduce is not one of our baselines).
PAPER_TO_OURS: Dict[str, Optional[str]] = {
    "PHub": "phub",
    "PShard": "pshard",
    "MXNet-IB": None,
    "PSLite-IB-Shard": None,
    "PSLite-ZMQ-Shard": "pslite-shard",
    "Gloo-Ring-Chunked": "gloo-ring",
    "Gloo-Halving-Doubling": None,
}
OURS_TO_PAPER: Dict[str, str] = {ours: paper for paper, ours in PAPER_TO_OURS.items() if ours}
# The paper's "stock MXNet" baseline (ps-lite over ZeroMQ, sharded) is pslite-shard here.
OURS_TO_PAPER.setdefault("pslite-shard", "stock MXNet")

# Model names used in the paper's tables -> the model names of phub's layouts.
PAPER_MODEL = {"inception": "inception-v3", "resnet": "resnet269"}


def system_label(name: str) -> str:
    """One legend label per system, the same in the paper's panel and ours ("ours = paper's")."""
    if name in PAPER_TO_OURS:
        ours = PAPER_TO_OURS[name]
        return f"{ours} = {name}" if ours else f"{name} (paper only)"
    paper = OURS_TO_PAPER.get(name)
    return f"{name} = {paper}" if paper else f"{name} (ours only)"


@dataclass(frozen=True)
class Table:
    """One reference CSV: its rows and its `#` provenance lines (without the leading '# ')."""
    name: str
    data: pd.DataFrame
    provenance: List[str]


def read_table(path: Path) -> Table:
    """Read one commented CSV; ValueError naming the file when it cannot be parsed."""
    lines = path.read_text().splitlines()
    provenance = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    try:
        data = pd.read_csv(path, comment="#")
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"{path.name}: not a readable CSV ({exc})") from None
    return Table(path.stem, data, provenance)


def load(directory: Path = REFERENCE_DIR) -> Dict[str, Table]:
    """Every reference table by name (file stem), e.g. `load()["cost"].data`."""
    tables = {p.stem: read_table(p) for p in sorted(Path(directory).glob("*.csv"))}
    if not tables:
        raise FileNotFoundError(f"no reference CSVs in {directory}")
    return tables
