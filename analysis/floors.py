"""Each run's floor and what bounded it, the same way for every results file, old or new.

A run's *floor* is the larger of its replayed compute per iteration and its busiest link's bytes
per iteration at the configured rate (`experiments.monitor.floors`); `over_floor` is its time
over that floor. The bound (`experiments.monitor.classify`) is judged against the floor:
``compute`` within NEAR_FLOOR of the compute floor, ``wire`` when a link ran at >= LINK_FULL of
its rate, ``cpu`` when the cores or one process were saturated, ``other`` for the rest.

Newer run files record the floors (the runner measures the busiest link's bytes over the exact
timed window). Older ones do not; for them the floors are rebuilt from what they do record: the
compute floor from the model's compute profile divided by s_t (what the replay ran), the wire
floor as the busiest link's utilization times the run's seconds per iteration (the same figure
over the median iteration instead of the whole window). The bound is judged again from the
recorded CPU and link figures either way, so that every row of a report carries the same words
(older files said ``mixed`` for cores between 60% and 85% busy, which said nothing about what set
the pace).
"""
from __future__ import annotations

import math
from functools import lru_cache

import pandas as pd

from experiments.monitor import FLOOR_COLUMNS, classify, floors


# "mixed" (cores 60-85% busy, no link full) said that nothing ran full and the cores were not
# saturated: "other", when the figures to judge it again are missing
OLD_WORDS = {"mixed": "other"}
FIGURES = FLOOR_COLUMNS + ("cpu_busy", "busiest_process_cpu", "link_utilization")  # numbers a row may lack


@lru_cache(maxsize=None)
def _profile_seconds(model: str) -> float:
    """The model's compute seconds per iteration on the paper's GPU; NaN for a model without a
    profile (a synthetic layout)."""
    from experiments.models import MODELS, compute_profile

    return compute_profile(model).seconds_per_iteration if model in MODELS else math.nan


def compute_floor(row) -> float:
    """The compute a run replayed per iteration: 0 with compute removed, the profile / s_t with
    replayed compute, NaN when unknown (real compute, whose seconds the row does not carry)."""
    if row.compute == "zero" or row.variant == "no_compute":
        return 0.0
    if row.compute != "replay":
        return math.nan
    s_t = row.s_t if pd.notna(row.s_t) and row.s_t else 1.0
    return _profile_seconds(str(row.model)) / s_t


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value is not pd.NA


def settle(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with the floor columns filled where a file lacks them and `bound` judged anew from
    each row's recorded CPU and link figures (where a row has none, its recorded word is kept:
    OLD_WORDS; "" where it has neither)."""
    out = runs.copy()
    if out.empty:
        return out
    for column in FIGURES:
        out[column] = pd.to_numeric(out[column], errors="coerce") if column in out else math.nan
    if "bound" not in out:
        out["bound"] = ""
    bounds = []
    for index, row in zip(out.index, out.itertuples()):
        seconds = row.seconds_per_iteration
        compute = row.compute_floor_seconds if _known(row.compute_floor_seconds) else compute_floor(row)
        link = row.link_utilization if _known(row.link_utilization) else None
        wire = row.wire_floor_seconds
        if not _known(wire):
            wire = link * seconds if link is not None and _known(seconds) else math.nan
        if _known(seconds) and seconds > 0:
            filled = floors(float(seconds), None if math.isnan(compute) else compute,
                            None if math.isnan(wire) else wire)
            for column in FLOOR_COLUMNS:
                out.at[index, column] = math.nan if filled[column] is None else filled[column]
        recorded = _known(row.cpu_busy) or _known(row.busiest_process_cpu)
        over_compute = seconds / compute if compute and not math.isnan(compute) and _known(seconds) else None
        if recorded:
            bounds.append(classify(_or_none(row.cpu_busy), _or_none(row.busiest_process_cpu), link, over_compute))
        else:  # a file with the word but not the figures behind it: kept, in today's words
            bounds.append(OLD_WORDS.get(str(row.bound), str(row.bound)) if _known(row.bound) else "")
    out["bound"] = bounds
    return out


def _or_none(value):
    return float(value) if _known(value) else None
