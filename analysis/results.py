"""Load and validate the tidy result CSVs that the experiments write.

A results directory holds, at any depth, two kinds of CSV file:

* **run files** (one row per measured run), with the columns of `COLUMNS` below. Extra columns
  are kept. `exchanges_per_s` counts whole-model exchanges (one worker pushing its gradients and
  receiving new weights) per second, summed over the workers of the job.
* **convergence curves**, with the columns `framework, workers, epoch` and a loss column:
  `loss`, or `train_loss` as `experiments.convergence` writes it.

A file is read as a run file when it has an `experiment` column, or as a convergence curve when
it has `framework` and `epoch` columns; a file whose every row is of the software-cost experiment
(`experiment` = "software_cost", CPU seconds by role: columns of its own) goes to its own table.
Every run row gets its floors and its bound judged by `analysis.floors` as it loads. Any other
file, a missing column, or a value that does not parse raises `ResultsError`, and the message
names the file, the column and the first bad row.
Files whose names start with "." are skipped, because those are temporary files from atomic writes.

Run files may also carry the columns of `OPTIONAL` (what bounded the run, its CPU and link use,
the paper-equivalent chunk size, how its result was verified, the job of a multi-tenant run, and
the calibration's per-core rates). Older files without them still load: the missing columns are
added empty, and an empty `bound` or `verify_kind` means "not recorded".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Union

import pandas as pd

from experiments.monitor import FLOOR_COLUMNS

from . import floors

EXPERIMENTS = ("pbox", "capacity", "scaling", "cross_rack", "oversubscription", "breakdown",
               "chunk_sweep", "convergence", "multitenant", "calibration")
SYSTEMS = ("phub", "pshard", "pslite-central", "pslite-shard", "gloo-ring")
NETWORKS = ("loopback", "emulated", "cluster")
SETTINGS = ("cloud10g", "ib56g", "")
COMPUTE = ("zero", "replay", "real")
VARIANTS = ("full", "no_aggregation", "no_optimizer", "no_compute", "alone", "shared", "")
# What set a run's pace (experiments.monitor.classify); "mixed" is what older files said of cores
# 60-85% busy: such rows are judged again from their figures when loaded (analysis.floors).
BOUNDS = ("compute", "wire", "cpu", "other", "mixed", "")
# oracle: checked against a reference result; workers_agree (real compute): the workers' weights
# checked against each other; none: nothing to check (e.g. a variant without the optimizer)
VERIFY_KINDS = ("oracle", "workers_agree", "none", "")

INTEGER = ("workers", "racks", "interfaces", "cores", "chunk_bytes", "repeat", "chunk_bytes_paper",
           "chunks_per_worker", "job")
REAL = ("oversubscription", "link_gbps", "link_gbps_measured", "s_n", "s_m", "s_t",
        "seconds_per_iteration", "exchanges_per_s", "samples_per_s", "bytes_per_worker", "cpu_busy",
        "cpu_steal", "busiest_process_cpu", "link_utilization", "tcp_retransmits", "tcp_timeouts",
        "chunks_per_s_per_core", "gbit_per_s_per_core", "simulated_racks", "service_cpu", "pbox_link_gbps",
        "uplink_gbps") + FLOOR_COLUMNS
BOOLEAN = ("verified",)
COLUMNS = ("experiment", "point", "system", "model", "workers", "racks", "interfaces", "cores",
           "chunk_bytes", "oversubscription", "network", "setting", "link_gbps",
           "link_gbps_measured", "s_n", "s_m", "s_t", "compute", "variant", "repeat",
           "seconds_per_iteration", "exchanges_per_s", "samples_per_s", "bytes_per_worker",
           "verified", "git_commit", "host")
# Columns that newer run files carry; a file without them loads with them empty.
OPTIONAL = ("bound", "cpu_busy", "busiest_process", "busiest_process_cpu", "link_utilization",
            "chunk_bytes_paper", "chunks_per_worker", "verify_kind", "job", "chunks_per_s_per_core",
            "gbit_per_s_per_core", "tcp_retransmits", "tcp_timeouts", "cpu_steal", "simulated_racks", "service_cpu",
            "pbox_link_gbps", "uplink_gbps") + FLOOR_COLUMNS
# Columns that may not be empty on any row (the others can be empty where they do not apply,
# e.g. samples_per_s in a run with compute removed).
REQUIRED_VALUES = ("experiment", "system", "workers", "repeat")
ALLOWED = {"experiment": EXPERIMENTS, "system": SYSTEMS, "network": NETWORKS, "setting": SETTINGS,
           "compute": COMPUTE, "variant": VARIANTS, "bound": BOUNDS, "verify_kind": VERIFY_KINDS}
# A calibration run measures one server core with no job around it: no network setting or compute.
EMPTY_IN_CALIBRATION = ("network", "compute")
CONVERGENCE_COLUMNS = ("framework", "workers", "epoch", "loss")
SOFTWARE_COST = "software_cost"

PathLike = Union[str, Path]


class ResultsError(ValueError):
    """A results file is malformed; the message names the file and the column."""


@dataclass
class Results:
    runs: pd.DataFrame  # one row per measured run, COLUMNS (+ extras) plus `source_file`
    convergence: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CONVERGENCE_COLUMNS))
    # the software-cost experiment's rows (experiment "software_cost": CPU seconds by role, with
    # columns of their own), as written; empty when the run has none
    software_cost: pd.DataFrame = field(default_factory=pd.DataFrame)


def empty_runs() -> pd.DataFrame:
    """A run table with no rows (what a run that measured nothing looks like)."""
    return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS + OPTIONAL + ("source_file",)})


def _dtype(column: str) -> str:
    if column in INTEGER:
        return "Int64"
    if column in REAL:
        return "float64"
    if column in BOOLEAN:
        return "boolean"
    return "object"


_LINE = "_line"  # a run row's line in its file (line 1 is the header), for error messages only


def _first_line(mask: pd.Series) -> int:
    """The line in its file of the first True in a one-file mask (line 1 is the header)."""
    return int(mask.to_numpy().nonzero()[0][0]) + 2


def _first_bad(frame: pd.DataFrame, mask: pd.Series) -> tuple:
    """(file, line) of the first True in mask: the rows of every run file, concatenated."""
    i = int(mask.to_numpy().nonzero()[0][0])
    return Path(frame["source_file"].iloc[i]), int(frame[_LINE].iloc[i])


def _fail(path: Path, message: str) -> None:
    raise ResultsError(f"{path}: {message}")


def _read(path: Path) -> pd.DataFrame:
    try:
        # Everything as text first, so that a bad value can be reported with its column and row.
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        _fail(path, "empty file (not even a header line)")
    except pd.errors.ParserError as exc:
        _fail(path, f"not a readable CSV ({exc})")
    raise AssertionError("unreachable")


def _convert(frame: pd.DataFrame) -> pd.DataFrame:
    """Typed copy of the run files' text columns (every file's rows at once: converting file by
    file took seconds); ResultsError on the first value that does not parse, naming its file and line."""
    out = frame.copy()
    for column in INTEGER + REAL:
        text = frame[column].str.strip()
        numbers = pd.to_numeric(text.where(text != ""), errors="coerce")
        bad = numbers.isna() & (text != "")
        if bad.any():
            path, line = _first_bad(frame, bad)
            _fail(path, f"column {column!r}, line {line}: {text[bad].iloc[0]!r} is not a number")
        if column in INTEGER:
            fractional = numbers.notna() & (numbers != numbers.round())
            if fractional.any():
                path, line = _first_bad(frame, fractional)
                _fail(path, f"column {column!r}, line {line}: {text[fractional].iloc[0]!r} is not a whole number")
            numbers = numbers.round().astype("Int64")
        out[column] = numbers
    for column in BOOLEAN:
        text = frame[column].str.strip().str.lower()
        mapping = {"true": True, "1": True, "false": False, "0": False, "": pd.NA}
        bad = ~text.isin(list(mapping))
        if bad.any():
            path, line = _first_bad(frame, bad)
            _fail(path, f"column {column!r}, line {line}: {frame[column][bad].iloc[0]!r} is not true/false")
        out[column] = text.map(mapping).astype("boolean")
    calibration = out["experiment"] == "calibration"
    for column, allowed in ALLOWED.items():
        bad = ~out[column].isin(allowed)
        if column in EMPTY_IN_CALIBRATION:
            bad &= ~(calibration & (out[column] == ""))
        if bad.any():
            path, line = _first_bad(frame, bad)
            _fail(path, f"column {column!r}, line {line}: {out[column][bad].iloc[0]!r} is not one "
                        f"of {', '.join(repr(a) for a in allowed)}")
    for column in REQUIRED_VALUES:
        missing = out[column].isna() | (out[column].astype(str) == "")
        if missing.any():
            path, line = _first_bad(frame, missing)
            _fail(path, f"column {column!r} is empty on line {line}")
    return out.drop(columns=[_LINE])


def _convergence(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    if "loss" not in frame.columns and "train_loss" in frame.columns:
        frame = frame.rename(columns={"train_loss": "loss"})
    missing = [c for c in CONVERGENCE_COLUMNS if c not in frame.columns]
    if missing:
        _fail(path, f"convergence curve without column(s) {', '.join(repr(c) for c in missing)}")
    out = frame.copy()
    for column in ("workers", "epoch", "loss"):
        numbers = pd.to_numeric(frame[column].str.strip(), errors="coerce")
        if numbers.isna().any():
            _fail(path, f"column {column!r}, line {_first_line(numbers.isna())}: "
                        f"{frame[column][numbers.isna()].iloc[0]!r} is not a number")
        out[column] = numbers
    out["workers"] = out["workers"].astype(int)
    return out


def _run_file(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """A run file's rows as text, every optional column present, tagged with their file and line."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        _fail(path, f"missing column(s) {', '.join(repr(c) for c in missing)} "
                    f"(a run file needs: {', '.join(COLUMNS)})")
    frame = frame.copy()
    for column in OPTIONAL:
        if column not in frame.columns:
            frame[column] = ""
    frame["source_file"] = str(path)
    frame[_LINE] = range(2, len(frame) + 2)
    return frame


def load(directory: PathLike) -> Results:
    """Every CSV under `directory`, concatenated: run files into `runs`, curves into `convergence`.

    A directory with no CSV files gives empty tables (the figures then say "no data").
    FileNotFoundError if the directory does not exist.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"results directory {directory} does not exist")
    runs: List[pd.DataFrame] = []
    curves: List[pd.DataFrame] = []
    software: List[pd.DataFrame] = []
    for path in sorted(directory.rglob("*.csv")):
        if any(part.startswith(".") for part in path.relative_to(directory).parts):
            continue
        frame = _read(path)
        if "experiment" in frame.columns and (frame["experiment"] == SOFTWARE_COST).all() and len(frame):
            software.append(frame.assign(source_file=str(path)))
        elif "experiment" in frame.columns:
            runs.append(_run_file(frame, path))
        elif {"framework", "epoch"} <= set(frame.columns):
            curves.append(_convergence(frame, path))
        else:
            _fail(path, "missing column 'experiment' (a run file) or 'framework' and 'epoch' "
                        "(a convergence curve)")
    result = Results(floors.settle(_convert(pd.concat(runs, ignore_index=True))) if runs else empty_runs())
    if curves:
        result.convergence = pd.concat(curves, ignore_index=True)
    if software:
        result.software_cost = pd.concat(software, ignore_index=True).apply(pd.to_numeric, errors="ignore")
    return result


def experiment(runs: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of one experiment (a copy, so callers may add columns)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return runs[runs["experiment"] == name].copy()
