"""What a training deployment costs, priced from `reference/prices.csv` (our estimates).

The cost counts what the paper's cost analysis counts: network devices (switch ports, adapters,
cables), GPUs, and for PHub the whole PBox machine. Other parts of the worker machines are not
counted. For W workers in R racks, links of speed tier G and core oversubscription k:1:

* every worker: one GPU, one adapter, one cable and one top-of-rack switch port;
* PHub only: one PBox per rack, i.e. the machine plus K x (adapter + cable + top-of-rack port),
  where K is its number of interfaces;
* the core, when R > 1: k:1 means each rack's uplinks carry 1/k of its workers' downlink
  bandwidth, so a rack gets ceil(W / R / k) uplinks. Each uplink costs two switch ports (top of
  rack and core) and one cable. All systems share the same core, so the core costs the same for each.

The speed tier is the paper-scale link speed (the configured rate times s_n, which undoes the
emulation's scaling), rounded to the nearest tier in the price table.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import pandas as pd

from .reference import REFERENCE_DIR, read_table

PRICE_COLUMNS = ("item", "link_gbps", "usd", "unit", "source", "note")
PER_LINK_SPEED = ("switch_port", "nic", "cable")


def load_prices(path: Path = REFERENCE_DIR / "prices.csv") -> pd.DataFrame:
    """The price table; ValueError naming the file and column when a column is missing."""
    prices = read_table(Path(path)).data
    missing = [c for c in PRICE_COLUMNS if c not in prices.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    return prices


def tier(prices: pd.DataFrame, gbps: float) -> float:
    """The price table's link speed nearest to `gbps`, on a log scale."""
    tiers = sorted(prices["link_gbps"].dropna().unique())
    if not tiers:
        raise ValueError("the price table has no per-link-speed rows")
    if not gbps or gbps <= 0 or math.isnan(gbps):
        raise ValueError(f"link speed {gbps!r} Gbps cannot be priced")
    return min(tiers, key=lambda t: abs(math.log(t / gbps)))


def price(prices: pd.DataFrame, item: str, gbps: Optional[float] = None) -> float:
    """USD of one `item` (at link speed `gbps` for ports, adapters and cables)."""
    rows = prices[prices["item"] == item]
    if item in PER_LINK_SPEED:
        rows = rows[rows["link_gbps"] == tier(prices, gbps)]
    if len(rows) != 1:
        raise ValueError(f"price table: expected one row for {item!r}"
                         f"{f' at {gbps} Gbps' if gbps else ''}, found {len(rows)}")
    return float(rows["usd"].iloc[0])


def deployment_cost(prices: pd.DataFrame, system: str, workers: int, racks: int, interfaces: int,
                    oversubscription: float, gbps: float) -> float:
    """USD of the deployment described in the module docstring."""
    port, nic, cable = (price(prices, item, gbps) for item in PER_LINK_SPEED)
    racks = max(int(racks), 1)
    cost = workers * (price(prices, "gpu") + nic + cable + port)
    if system == "phub":
        cost += racks * (price(prices, "pbox") + interfaces * (nic + cable + port))
    if racks > 1:
        uplinks = math.ceil(workers / racks / max(float(oversubscription), 1.0))
        cost += racks * uplinks * (2 * port + cable)
    return cost
