"""`results/report.md`: every paper claim beside our number with a verdict, the figures, and the
facts of the run (network, scale factors, measured link rates, host, commit)."""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Union

import pandas as pd

from . import racks
from . import reference as reference_data
from .claims import all_claims
from .derive import failed_verification, unchecked
from .fig_softcost import report_lines
from .figures import FIGURES
from .output import write_text
from .results import Results
from experiments.monitor import LINK_FULL

from .verdict import AGREE, CPU_MARK, DERIVED, DIFFER, NO_DATA, NOT_TESTABLE, PAPER_ONLY, RULE, Claim, fmt


def _cell(text: str) -> str:
    """Markdown table cells cannot hold a bare '|' or a line break."""
    return str(text).replace("|", "\\|").replace("\n", " ")


COLUMNS = ("claim", "paper", "ours", "ours / paper", "verdict", "bound", "why")
SUMMARY = ((AGREE, "measured agree"), (DIFFER, "measured differ"), (NOT_TESTABLE, "not testable here"),
           (NO_DATA, "no data"), (PAPER_ONLY, "paper only"), (DERIVED, "derived"))


def claims_table(claims: List[Claim]) -> str:
    """One markdown table per section, one row per claim."""
    lines: List[str] = []
    section = None
    for c in claims:
        if c.section != section:
            section = c.section
            lines += ["", f"### {section}", "", "| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
        ratio = "—" if c.ratio is None else f"{c.ratio:.2f}"
        lines.append("| " + " | ".join(_cell(x) for x in (c.claim, fmt(c.paper, c.unit), fmt(c.ours, c.unit),
                                                            ratio, f"**{c.verdict}**", c.bound, c.reason)) + " |")
    return "\n".join(lines)


def summary(claims: List[Claim]) -> str:
    """Each verdict kind with its count, e.g. '3 measured agree, 1 measured differ, ...'."""
    tally = Counter(c.verdict for c in claims)
    return ", ".join(f"{tally[v]} {words}" for v, words in SUMMARY)


def _values(runs: pd.DataFrame, column: str) -> str:
    values = sorted({str(v) for v in runs[column].dropna() if str(v) != ""})
    return ", ".join(values) if values else "—"


def facts(runs: pd.DataFrame) -> str:
    """The run's facts, from the result rows themselves."""
    if runs.empty:
        return "No run rows were found: every measured claim below is **no data**."
    per_experiment = ", ".join(f"{name} {count}" for name, count in sorted(Counter(runs["experiment"]).items()))
    lines = [f"- rows: {len(runs)} ({per_experiment})",
             f"- network: {_values(runs, 'network')}; setting: {_values(runs, 'setting')}; "
             f"compute: {_values(runs, 'compute')}",
             f"- scale factors: s_n = {_values(runs, 's_n')}; s_m = {_values(runs, 's_m')}; "
             f"s_t = {_values(runs, 's_t')}",
             f"- hosts: {_values(runs, 'host')}; git commits: {_values(runs, 'git_commit')}"]
    failed = int(failed_verification(runs).sum())
    lines.append(f"- runs that failed verification (left out of every number): {failed}"
                 + (" **(check these)**" if failed else ""))
    nothing = int((runs["verify_kind"] == "none").sum()) if "verify_kind" in runs else 0
    lines.append(f"- runs with nothing to verify (verify_kind none, kept): {nothing}")
    old = int(unchecked(runs).sum())
    if old:
        lines.append(f"- runs not verified whose file does not record verify_kind (older files, kept): {old}")
    bound = runs["bound"].fillna("").replace("", "not recorded") if "bound" in runs else None
    if bound is not None:
        lines.append("- runs by what bounded them: " + ", ".join(f"{b} {n}" for b, n in sorted(Counter(bound).items())))
    links = runs.dropna(subset=["link_gbps"])
    if not links.empty:
        lines += ["", "Link rates (Gbps), configured vs measured (median over runs):", "",
                  "| experiment | configured | measured | measured / configured |", "|---|---|---|---|"]
        for (name, configured), rows in links.groupby(["experiment", "link_gbps"]):
            measured = rows["link_gbps_measured"].median()
            ratio = "—" if pd.isna(measured) else f"{measured / configured:.2f}"
            lines.append(f"| {name} | {configured:g} | {fmt(measured)} | {ratio} |")
    return "\n".join(lines)


def floors_table(runs: pd.DataFrame) -> str:
    """Per experiment and system: how far its runs ran above their floors, and what bounded them
    (the material of every ceiling in the claims below)."""
    if runs.empty or "over_floor" not in runs or runs["over_floor"].isna().all():
        return "No run recorded its floor."
    lines = ["| experiment | system | runs | time / floor: median (range) | bound: compute / wire / cpu / other |",
             "|---|---|---|---|---|"]
    for (name, system), rows in runs.dropna(subset=["over_floor"]).groupby(["experiment", "system"]):
        over = rows["over_floor"]
        tally = Counter(rows["bound"])
        lines.append(f"| {name} | {system} | {len(rows)} | {over.median():.2f} ({over.min():.2f}–{over.max():.2f}) | "
                     + " / ".join(str(tally.get(b, 0)) for b in ("compute", "wire", "cpu", "other")) + " |")
    return "\n".join(lines)


def figures_list(figures_dir: Union[str, Path], report_path: Union[str, Path]) -> str:
    """Each expected figure with its path relative to the report, or 'missing'."""
    base = Path(report_path).resolve().parent
    lines = []
    for name in FIGURES:
        png = Path(figures_dir).resolve() / f"{name}.png"
        relative = os.path.relpath(png, base)
        lines.append(f"- [{name}]({relative})" if png.exists() else f"- {name}: missing ({relative})")
    return "\n".join(lines)


def render(results: Results, figures_dir: Union[str, Path], report_path: Union[str, Path], ref=None,
           compute_seconds: Optional[Mapping[str, float]] = None, model: Optional[str] = None) -> str:
    """The report as markdown text; `model`, the calibrated model's section (analysis.model),
    made apart because it takes minutes."""
    ref = reference_data.load() if ref is None else ref
    claims = all_claims(results.runs, ref, compute_seconds, results.software_cost)
    return "\n".join([
        "# PHub reproduction: the paper's claims vs this run", "",
        "Each row is one claim of the paper (the SoCC'18 paper and its posters; the numbers are in "
        "`analysis/reference/`, with provenance) beside what this run measured. "
        f"Claims: {len(claims)} ({summary(claims)}). Only measured rows (agree, differ) count as "
        "measurements.", "",
        "## How agreement is judged", "", RULE, "",
        "## The run", "", facts(results.runs), "",
        "### How far the runs ran above their floors", "",
        "A run's floor is the larger of its replayed compute and its busiest link's bytes at the configured "
        "rate. A system near 1.0 is held by the testbed (the wire or the replayed GPU) and can only show "
        "the paper's gains as far as the baseline's time over this floor allows: that is each claim's "
        "ceiling.", "", floors_table(results.runs), "",
        "## Claims", claims_table(claims), "",
        "## Racks on the wire (our extension)", "", *racks.report_lines(results.runs), "",
        "## The software cost one machine can show", "",
        "Every system on unshaped loopback, compute removed, full-size models: what the emulated rack "
        "divides away (its links run s_n times slower while the CPU does not).", "",
        *report_lines(results.software_cost, ref), "",
        "## A calibrated model of the paper's hardware (derived, never measured)", "",
        model.strip() if model else "Not made for this run (`python -m analysis.model --results DIR`).", "",
        "## Figures", "", "Ours beside the paper's. The captions are in `analysis/captions/`.", "",
        figures_list(figures_dir, report_path), ""])


def check(results: Results, figures_dir: Union[str, Path], report_path: Union[str, Path], ref=None,
          compute_seconds: Optional[Mapping[str, float]] = None, min_measured: int = 1) -> List[str]:
    """What a finished run lacks (empty: nothing): a figure that is missing or not a PNG, a claim
    with no row in the report, a verdict without its data (see Claim.problems), a differ row
    without a cause, a report row that uses CPU-bound points without saying so, a run labelled wire
    whose busiest link was not LINK_FULL busy, and fewer than `min_measured` rows with a number
    this run measured (agree, differ or not testable here: a coverage check; derived and
    paper-only rows never count)."""
    problems = []
    for name in FIGURES:
        png = Path(figures_dir) / f"{name}.png"
        if not png.is_file():
            problems.append(f"figure {name}: {png} is missing")
        elif png.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n" or png.stat().st_size < 1000:
            problems.append(f"figure {name}: {png} is not a PNG image")
    try:
        text = Path(report_path).read_text()
    except OSError as exc:
        return problems + [f"report {report_path}: cannot read it: {exc.strerror or exc}"]
    rows = report_rows(text)
    claims = all_claims(results.runs, reference_data.load() if ref is None else ref, compute_seconds,
                        results.software_cost)
    problems += [f"report {report_path}: no row for the claim {c.claim!r}" for c in claims if _cell(c.claim) not in rows]
    problems += [f"claim {c.claim!r} {p}" for c in claims for p in c.problems()]
    for claim, cells in rows.items():
        bound, why = cells.get("bound", ""), cells.get("why", "")
        if "cpu" in bound and CPU_MARK not in why:
            problems.append(f"report {report_path}: the row {claim!r} uses CPU-bound points ({bound}) "
                            f"without saying {CPU_MARK!r}")
        if cells.get("verdict") == f"**{DIFFER}**" and "Cause: " not in why and "Cause unknown" not in why:
            problems.append(f"report {report_path}: the row {claim!r} differs without a cause")
    wire = results.runs[results.runs["bound"] == "wire"] if "bound" in results.runs else results.runs.iloc[:0]
    short = wire[~(pd.to_numeric(wire["link_utilization"], errors="coerce") >= LINK_FULL)]
    problems += [f"run {r.experiment}/{r.point} repeat {r.repeat}: labelled wire with its busiest link "
                 f"{r.link_utilization} busy (< {LINK_FULL})" for r in short.itertuples()]
    measured = sum(c.verdict in (AGREE, DIFFER, NOT_TESTABLE) for c in claims)
    if measured < min_measured:
        problems.append(f"only {measured} of {len(claims)} claims have a measured value (expected >= {min_measured}; "
                        f"{summary(claims)})")
    return problems


def report_rows(text: str) -> Dict[str, Dict[str, str]]:
    """The claim rows of a written report: claim -> {column: cell}."""
    out: Dict[str, Dict[str, str]] = {}
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| claim |") or line.startswith("| kind of number"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == len(COLUMNS):
            out[cells[0]] = dict(zip(COLUMNS, cells))
        else:
            out.setdefault(cells[0], {})
    return out


def write(results: Results, figures_dir: Union[str, Path], out: Union[str, Path], ref=None,
          compute_seconds: Optional[Mapping[str, float]] = None, model: Optional[str] = None) -> Path:
    """Write the report to `out` atomically; return its path."""
    return write_text(out, render(results, figures_dir, out, ref, compute_seconds, model))
