"""The model's CPU costs, fitted from the software-cost rows, and those rows' loader.

The software-cost experiment (every system on unshaped loopback, compute removed, full-size
messages at two message-size settings) records, per (repeat, role), the CPU seconds of that role
per exchange, its payload bytes and its messages per exchange. One `Costs` per (system, role) is
fitted to them by least squares:

    cpu_seconds_per_exchange  ~  per_byte x bytes_per_exchange + per_message x messages_per_exchange

over every model and both message settings at once (the medians of the repeats), with no
intercept, both coefficients at least zero, and each row's residual taken relative to its value
(so a small model's point weighs as much as a big one's). The two message settings are what
separate the two coefficients: at a fixed model the bytes stay and the messages change. Each
`Costs` also carries the median share of the role's CPU its processes' busiest threads did
(`busiest_share`, 1 where the rows do not record it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Union

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from .replay import Costs, RoleCosts

ROLES = ("server", "worker_io", "worker_framework")
REQUIRED = ("experiment", "system", "model", "workers", "message_setting", "role", "cpu_seconds_per_exchange",
            "bytes_per_exchange", "messages_per_exchange", "seconds_per_iteration", "repeat")
NUMERIC = ("workers", "cpu_seconds_per_exchange", "bytes_per_exchange", "messages_per_exchange",
           "seconds_per_iteration", "wait_seconds_per_exchange", "machine_cores", "busiest_thread_share")
# Optional: each role's run-queue wait per exchange (schedstat's 2nd field) and its processes'
# busiest threads' share of its CPU, recorded by runs after they were added; older rows lack the
# columns or leave them empty (no wait recorded; the whole role on one thread).
WAIT = "wait_seconds_per_exchange"
SHARE = "busiest_thread_share"


class SoftCostError(ValueError):
    """A software-cost file is malformed; the message names the file and the column."""


def load_softcost(directory: Union[str, Path]) -> pd.DataFrame:
    """Every software-cost row under `directory` (its `software_cost/` folder when it has one).
    No folder or no files: an empty frame. SoftCostError names the file of a missing column or a
    value that is not a number. Breakdown rows (role "breakdown") are kept; `fit` skips them."""
    directory = Path(directory)
    if (directory / "software_cost").is_dir():
        directory = directory / "software_cost"
    frames = []
    for path in sorted(directory.rglob("*.csv")) if directory.is_dir() else []:
        if any(part.startswith(".") for part in path.relative_to(directory).parts):
            continue  # a temporary file of an atomic write
        frame = pd.read_csv(path)
        if frame.get("experiment", pd.Series(dtype=object)).ne("software_cost").any():
            continue  # not a software-cost file
        missing = [c for c in REQUIRED if c not in frame.columns]
        if missing and (frame["role"] != "breakdown").any():
            raise SoftCostError(f"{path}: missing column(s) {', '.join(missing)}")
        for column in NUMERIC:
            if column in frame:
                values = pd.to_numeric(frame[column], errors="coerce")
                bad = values.isna() & frame[column].notna()
                if bad.any():
                    raise SoftCostError(f"{path}: column {column!r}, line {int(bad.to_numpy().nonzero()[0][0]) + 2}: "
                                        f"{frame[column][bad].iloc[0]!r} is not a number")
                frame[column] = values
        frame["source_file"] = str(path)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(REQUIRED))


def role_points(softcost: pd.DataFrame) -> pd.DataFrame:
    """The medians of the repeats: one row per (system, model, message_setting, role); `wait`
    is NaN where the rows did not record the run-queue wait."""
    rows = softcost[softcost["role"].isin(ROLES)].copy()
    for column in (WAIT, SHARE):
        if column not in rows:
            rows[column] = float("nan")
    keys = ["system", "model", "message_setting", "role"]
    return rows.groupby(keys).agg(
        cpu=("cpu_seconds_per_exchange", "median"), nbytes=("bytes_per_exchange", "median"),
        messages=("messages_per_exchange", "median"), seconds=("seconds_per_iteration", "median"),
        workers=("workers", "first"), wait=(WAIT, "median"), share=(SHARE, "median")).reset_index()


def machine_cores(softcost: pd.DataFrame, default: int) -> int:
    """The machine's cores the rows record (`machine_cores`, the most of them), else `default`
    (older rows lack the column)."""
    recorded = pd.to_numeric(softcost.get("machine_cores", pd.Series(dtype=float)), errors="coerce").dropna()
    return int(recorded.max()) if not recorded.empty else default


def cores_in_use(softcost: pd.DataFrame) -> float:
    """The cores the software-cost jobs kept busy: per block, every role's CPU seconds per
    exchange over its seconds per iteration, the median over blocks (NaN with no rows). On an
    idle 2-core machine a job whose work runs in parallel gets near 2; a job that shares the
    machine with other work (the committed run's load average was 5-8) gets what is left."""
    if "role" not in softcost:
        return float("nan")
    rows = softcost[softcost["role"].isin(ROLES)]
    if rows.empty:
        return float("nan")
    blocks = rows.groupby(["system", "model", "message_setting", "repeat"]).agg(
        cpu=("cpu_seconds_per_exchange", "sum"), seconds=("seconds_per_iteration", "first"))
    return float((blocks["cpu"] / blocks["seconds"]).median())


def fit_one(points: pd.DataFrame) -> Costs:
    """Non-negative least squares on relative residuals for one (system, role)."""
    weight = 1.0 / points["cpu"].clip(lower=1e-12).to_numpy()
    design = np.column_stack([points["nbytes"].to_numpy() * weight, points["messages"].to_numpy() * weight])
    scale = design.max(axis=0)
    scale[scale == 0] = 1.0
    (per_byte, per_message), _ = nnls(design / scale, points["cpu"].to_numpy() * weight)
    share = points["share"].median()  # role_points: NaN where the rows did not record it
    return Costs(per_message=float(per_message / scale[1]), per_byte=float(per_byte / scale[0]),
                 busiest_share=1.0 if pd.isna(share) else float(min(max(share, 0.0), 1.0)))


def fit(softcost: pd.DataFrame) -> Dict[str, RoleCosts]:
    """One RoleCosts per system that has rows (roles without rows cost nothing)."""
    points = role_points(softcost)
    fitted = {}
    for system, rows in points.groupby("system"):
        fitted[system] = RoleCosts(**{role: fit_one(group) for role, group in rows.groupby("role")})
    return fitted


def fit_table(softcost: pd.DataFrame, fitted: Dict[str, RoleCosts]) -> pd.DataFrame:
    """Per (system, role): the costs, the rows they come from, and the fit's median and worst
    relative error on those rows (how well two numbers carry every model and setting)."""
    points = role_points(softcost)
    rows = []
    for (system, role), group in points.groupby(["system", "role"]):
        costs = getattr(fitted[system], role)
        predicted = costs.per_byte * group["nbytes"] + costs.per_message * group["messages"]
        error = (predicted / group["cpu"] - 1).abs()
        rows.append({"system": system, "role": role, "ns_per_byte": costs.per_byte * 1e9,
                     "us_per_message": costs.per_message * 1e6, "busiest_share": costs.busiest_share,
                     "points": len(group),
                     "settings": ", ".join(sorted(group["message_setting"].unique())),
                     "median_fit_error": float(error.median()), "worst_fit_error": float(error.max())})
    return pd.DataFrame(rows)
