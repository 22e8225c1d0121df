"""Claims of the PBox section: end-to-end speedups and their headlines."""
from __future__ import annotations

from typing import Dict, List

import pandas as pd

from .. import derive
from ..reference import PAPER_TO_OURS, Table
from ..verdict import CAUSE_UNKNOWN, Claim
from .causes import Side, TimeRatio, ratio_causes
from .common import NAN, PAPER_WORKERS, SETTING_WORDS, Runs, order, scaling_words, setup

SECTION = "End-to-end speedup over stock MXNet (8 workers)"


def speedup_claims(runs: Runs, ref: Dict[str, Table]) -> List[Claim]:
    paper = ref["speedup_end_to_end"].data
    ours = derive.speedups(runs.rows)
    pbox = runs.kept("pbox")
    differ = ("The paper used 8 workers with real NICs, RDMA and MXNet's C++ stack; ours run over TCP. "
              f"{setup(pbox)}")
    ib = ref["speedup_vs_mxnet_ib"].data
    out = [Claim("Headlines", "PHub up to 2.7x faster than MXNet over InfiniBand (AlexNet, 10 Gbps cloud)",
                 float(ib.loc[ib["model"] == "alexnet", "speedup"].iloc[0]), None, "paper_only", unit="x",
                 why="MXNet IB needs RDMA hardware: paper value only.")]
    for paper_name in ("PHub", "PShard"):
        system = PAPER_TO_OURS[paper_name]
        for setting, words in SETTING_WORDS.items():
            p = paper[(paper["system"] == paper_name) & (paper["network"] == setting)].set_index("model")["speedup"]
            mine = ours[(ours["system"] == system) & (ours["setting"] == setting)]
            best = mine.groupby("model")["speedup"].median()
            # "up to" is a best over models: compare the best over the models we measured on both sides
            paper_best = float(p[best.index].max()) if len(best) else float(p.max())
            workers = sorted(int(w) for w in mine["workers"].unique())
            where = dict(setting=setting, system=[system, derive.BASELINE], workers=workers)
            if best.empty:
                value, why, note = NAN, f"No {paper_name} and stock MXNet runs in {setting}.", ""
            else:
                value, why = float(best.max()), differ
                note = (f"Best over the {len(best)} model(s) measured (ours: {best.idxmax()}; paper: "
                        f"{p[best.index].idxmax()}), ours at {', '.join(map(str, workers))} workers, "
                        f"the paper's at {PAPER_WORKERS}.")
            ratios = {m: speedup_ratio(runs, system, setting, m, workers[-1]) for m in best.index}
            ceilings = {m: r.ceiling(scaling_words(r.top.rows)) for m, r in ratios.items()}
            top = max((m for m in ceilings if ceilings[m]), key=lambda m: ceilings[m].value, default=None)
            mine_best = best.idxmax() if len(best) else None
            out.append(Claim("Headlines", f"{paper_name} up to {p.max():g}x over stock MXNet ({words}, "
                             f"best model: {p.idxmax()})", paper_best, value, unit="x", why=why, note=note,
                             cause=ratio_causes(ratios.get(mine_best), paper_best),
                             evidence=runs.evidence("pbox", **where),
                             ceiling=ceilings[top] if top else None,
                             spread=ratios[mine_best].spread() if mine_best in ratios else None))
    for setting, words in SETTING_WORDS.items():
        out.append(_ranking_claim(runs, paper[paper["network"] == setting], ours[ours["setting"] == setting],
                                  setting, words, differ))
    at_eight = derive.speedups(runs.rows, workers=PAPER_WORKERS)
    measured = experiment_counts(runs.kept("pbox"))
    for row in paper[paper["system"].isin(["PHub", "PShard"])].itertuples():
        system = PAPER_TO_OURS[row.system]
        at_paper = at_eight[(at_eight["system"] == system) & (at_eight["setting"] == row.network)
                            & (at_eight["model"] == row.model)]
        mine = measured.get((system, row.network, row.model), [])
        where = dict(setting=row.network, model=row.model, system=[system, derive.BASELINE],
                     workers=PAPER_WORKERS)
        if len(at_paper):
            why = differ
        elif mine:
            why = f"Measured at {', '.join(map(str, mine))} workers only; the paper's count is {PAPER_WORKERS}."
        else:
            why = "Not measured in this run."
        ratio = speedup_ratio(runs, system, row.network, row.model, PAPER_WORKERS)
        out.append(Claim(SECTION, f"{row.system}, {row.model}, {row.network}", float(row.speedup),
                         float(at_paper["speedup"].median()) if len(at_paper) else NAN, unit="x", why=why,
                         note="Paper value chart-read." if row.provenance == "chart-read" else "",
                         cause=ratio_causes(ratio, float(row.speedup)), evidence=runs.evidence("pbox", **where),
                         **ratio.limits(scaling_words(ratio.top.rows))))
    return out


def _ranking_claim(runs: Runs, paper: pd.DataFrame, ours: pd.DataFrame, setting: str, words: str,
                   differ: str) -> Claim:
    """Systems ordered by their median speedup over models; stock MXNet is 1.0 by definition."""
    paper_medians = {PAPER_TO_OURS[s]: v for s, v in paper.groupby("system")["speedup"].median().items()
                     if PAPER_TO_OURS.get(s)}
    our_medians = {s: float(rows.groupby("model")["speedup"].median().median())
                   for s, rows in ours.groupby("system") if s in ("phub", "pshard")}
    workers = sorted(int(w) for w in ours["workers"].unique())
    where = dict(setting=setting, system=["phub", "pshard", derive.BASELINE], workers=workers)
    return Claim("Headlines", f"Ranking over models, {words}: PHub > PShard > stock MXNet",
                 order({**paper_medians, derive.BASELINE: 1.0}),
                 order({**our_medians, derive.BASELINE: 1.0}) if our_medians else [], "order",
                 why=differ if our_medians else "No runs in this setting.",
                 note=f"Ours at {', '.join(map(str, workers))} workers." if workers else "",
                 cause=CAUSE_UNKNOWN, evidence=runs.evidence("pbox", **where))


SYSTEM_WORDS = {derive.BASELINE: "stock MXNet (pslite-shard)", "pslite-central": "stock MXNet (pslite-central)"}


def speedup_ratio(runs: Runs, system: str, setting: str, model: str, workers: int) -> TimeRatio:
    """The speedup of `system` over stock MXNet at one point as a ratio of times: the baseline's
    over the system's (the system under test, whose floor bounds it)."""
    where = dict(setting=setting, model=model, workers=workers)
    return TimeRatio(Side(SYSTEM_WORDS[derive.BASELINE], runs.kept("pbox", system=derive.BASELINE, **where)),
                     Side(SYSTEM_WORDS.get(system, system), runs.kept("pbox", system=system, **where)))


def experiment_counts(pbox: pd.DataFrame) -> Dict[tuple, List[int]]:
    """(system, setting, model) -> the worker counts at which both it and stock MXNet ran."""
    base = pbox[pbox["system"] == derive.BASELINE]
    base_counts = {k: set(int(w) for w in g["workers"].dropna()) for k, g in base.groupby(["setting", "model"])}
    out: Dict[tuple, List[int]] = {}
    for (system, setting, model), g in pbox.groupby(["system", "setting", "model"]):
        counts = set(int(w) for w in g["workers"].dropna()) & base_counts.get((setting, model), set())
        if counts:
            out[(system, setting, model)] = sorted(counts)
    return out
