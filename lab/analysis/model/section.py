"""The report's section on the calibrated model: markdown, and the derived rows behind it.

    text = model_section(runs, softcost, reference.load())

`runs`: the tidy run rows (`analysis.results.load(DIR).runs`); `softcost`: the software-cost rows
(`analysis.model.load_softcost(DIR)`, empty when there are none); `ref`: the reference tables
(`analysis.reference.load()`, Table objects or plain frames by name). Nothing here is measured:
the predictions are derived rows.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import pandas as pd

from .calibrate import fit, fit_table
from .scenarios import PAPER
from .validate import (CPU_SPEED_RATIOS, error_summary, paper_predictions, predict_emulated,
                       predict_softcost)

GOAL_MEDIAN, GOAL_WORST = 0.10, 0.25


def _frames(ref) -> Dict[str, pd.DataFrame]:
    return {name: getattr(table, "data", table) for name, table in ref.items()}


def _percent(value: Optional[float]) -> str:
    return "–" if value is None or pd.isna(value) else f"{100 * value:.0f}%"


def _number(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def model_results(runs: pd.DataFrame, softcost: pd.DataFrame, ref, ratios=CPU_SPEED_RATIOS
                  ) -> Tuple[dict, pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(fitted costs, fit table, validation points, error summary, paper predictions).
    Takes minutes on this machine: about 120 emulated points, then 3 systems x 22 setups x
    len(ratios) paper-scale replays."""
    softcost = softcost if softcost is not None else pd.DataFrame()
    fitted = fit(softcost) if not softcost.empty else {}
    emulated = predict_emulated(runs, fitted)
    loopback = predict_softcost(softcost, fitted)
    summary = error_summary(emulated, loopback)
    predictions = paper_predictions(fitted, _frames(ref), runs, ratios) if fitted else pd.DataFrame()
    costs = fit_table(softcost, fitted) if fitted else pd.DataFrame()
    return fitted, costs, pd.concat([emulated, loopback], ignore_index=True), summary, predictions


def model_section(runs: pd.DataFrame, softcost: pd.DataFrame, ref, ratios=CPU_SPEED_RATIOS) -> str:
    """The markdown section (see the module docstring); `ratios`: the paper's CPU speed over this
    machine's, the first 1 if it holds one (the others give the range)."""
    fitted, costs, points, summary, predictions = model_results(runs, softcost, ref, ratios)
    return render(fitted, costs, points, summary, predictions)


def render(fitted, costs: pd.DataFrame, points: pd.DataFrame, summary: pd.DataFrame,
           predictions: pd.DataFrame) -> str:
    out = ["## A calibrated model of one iteration (derived, not measured)", "",
           "A discrete-event replay (SimPy) of one iteration: each layer's backward releases its "
           "gradient, its messages cross each link at the link's rate, each message and byte costs "
           "its node's CPU (fitted per system and role from the software-cost rows: "
           "CPU = per byte x bytes + per message x messages, one pair per role, no per-point factor), "
           "the servers aggregate and update, the weights go back and the next forward waits for them. "
           "This machine is modelled with every node sharing its 2 cores and the links at the rate "
           "the rack measured; the software-cost points (loopback) with no link limit, since moving "
           "bytes through loopback is CPU work the per-byte costs hold.", ""]
    if costs.empty:
        out += ["**No software-cost rows**: no CPU costs could be fitted, so the validation below "
                "runs with no CPU cost at all (links and compute only) and no paper-scale prediction "
                "is derived.", ""]
    else:
        out += ["### Fitted costs (this machine)", "",
                _table(["system", "role", "ns per byte", "µs per message", "points", "settings",
                        "fit error median / worst"],
                       [[r.system, r.role, _number(r.ns_per_byte, 3), _number(r.us_per_message, 1), r.points,
                         r.settings, f"{_percent(r.median_fit_error)} / {_percent(r.worst_fit_error)}"]
                        for r in costs.itertuples()]), ""]
    out += ["### Validation on this run", "",
            f"Goal in each regime: median |error| ≤ {GOAL_MEDIAN:.0%}, worst ≤ {GOAL_WORST:.0%}.", "",
            _table(["regime", "system", "points", "median |error|", "worst |error|", "goal"],
                   [[r.regime, r.system, r.points, _percent(r.median_abs_error), _percent(r.worst_abs_error),
                     "met" if r.median_abs_error <= GOAL_MEDIAN and r.worst_abs_error <= GOAL_WORST else "missed"]
                    for r in summary.itertuples()]), ""]
    worst = points.reindex(points["error"].abs().sort_values(ascending=False).index).head(8)
    if not worst.empty:
        out += ["Worst points:", "",
                _table(["regime", "experiment", "system", "model", "workers", "setting", "measured s",
                        "predicted s", "error"],
                       [[r.regime, getattr(r, "experiment", "") or "", r.system, r.model,
                         int(r.workers) if not pd.isna(r.workers) else "",
                         (getattr(r, "setting", "") if isinstance(getattr(r, "setting", ""), str) else "")
                         or (getattr(r, "message_setting", "") if isinstance(getattr(r, "message_setting", ""), str)
                             else ""),
                         _number(r.seconds, 3), _number(r.predicted, 3), _percent(r.error)]
                        for r in worst.itertuples()]), ""]
    if not predictions.empty:
        ratios = predictions["ratios"].iloc[0]
        out += ["### The paper's setup, predicted", "",
                f"8 workers, full-size models with the paper's per-model compute, links at 10 and 56 Gbps, "
                f"a PBox of {PAPER['pbox_interfaces']} interfaces and {PAPER['pbox_cores']} cores; worker "
                f"nodes with {PAPER['worker_node_cores']} cores each and PShard's shards with "
                f"{PAPER['shard_cores']} cores (assumed: the paper does not print them). The paper's CPUs "
                f"are assumed as fast as this machine's (ratio 1); the range is over ratios {ratios}. "
                "Stock MXNet is pslite-shard with MXNet's default big-array bound.", "",
                _table(["quantity", "model", "network", "system", "paper", "predicted (ratio 1)", "range",
                        "measured here (emulated)"],
                       [[r.quantity, r.model, r.network, r.system, _number(r.paper), _number(r.predicted),
                         f"{_number(r.low)}–{_number(r.high)}", _number(getattr(r, "measured_emulated", None))]
                        for r in predictions.itertuples()]), ""]
    return "\n".join(out)


__all__ = ["model_section", "model_results", "render", "CPU_SPEED_RATIOS"]
