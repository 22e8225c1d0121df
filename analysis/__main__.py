"""Command line of the analysis:

    python -m analysis figures --results DIR --out DIR
    python -m analysis report --results DIR --figures DIR --out results/report.md
    python -m analysis check --results DIR --figures DIR --report results/report.md [--min-measured N]

`figures` draws every figure (or those named with --only) into --out. `report` writes the claims
report. Both write atomically. `check` verifies a finished run: every figure is there, every
claim has its row in the report, no verdict lacks its data, every differ row names a cause, every
row that uses CPU-bound points says so, and at least N rows (default 1) are measured (agree or
differ; derived and paper-only rows never count); it lists what is wrong and exits 1. All three read every CSV under --results (see analysis.results).
A malformed results file stops the command with exit status 2 and a message that names the file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from . import figures, report, results


def _compute_seconds(text: Optional[str]):
    """--compute-seconds as JSON, e.g. '{"alexnet": 0.02}'."""
    if text is None:
        return None
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--compute-seconds is not JSON: {exc}") from None
    if not isinstance(mapping, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in mapping.values()):
        raise argparse.ArgumentTypeError("--compute-seconds must map model names to positive seconds")
    return mapping


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Figures beside the paper's, and the claims report, from tidy result CSVs.")
    commands = parser.add_subparsers(dest="command", required=True)
    fig = commands.add_parser("figures", help="draw every paper figure, ours beside the paper's")
    fig.add_argument("--results", required=True, help="directory of tidy result CSVs")
    fig.add_argument("--out", required=True, help="directory for the PNG files")
    fig.add_argument("--only", nargs="+", choices=list(figures.DRAWABLE), help="draw only these figures")
    rep = commands.add_parser("report", help="write the claims report (markdown)")
    rep.add_argument("--results", required=True, help="directory of tidy result CSVs")
    rep.add_argument("--figures", required=True, help="directory holding the figures (linked from the report)")
    rep.add_argument("--out", required=True, help="the report file, e.g. results/report.md")
    rep.add_argument("--model", default=None, type=Path,
                     help="the calibrated model's section to include (written by `python -m analysis.model`)")
    chk = commands.add_parser("check", help="check that a finished run has every figure and report row")
    chk.add_argument("--results", required=True, help="directory of tidy result CSVs")
    chk.add_argument("--figures", required=True, help="directory holding the figures")
    chk.add_argument("--report", required=True, help="the report file, e.g. results/report.md")
    chk.add_argument("--min-measured", type=int, default=1,
                     help="rows that must carry a number this run measured (agree, differ or not testable "
                          "here); derived and paper-only rows do not count")
    for sub in (fig, rep, chk):
        sub.add_argument("--compute-seconds", type=_compute_seconds, metavar="JSON",
                         help="compute seconds per iteration by model, for the bandwidth-per-PS numbers "
                              "(default: the paper's breakdown chart)")
    args = parser.parse_args(argv)
    try:
        loaded = results.load(args.results)
    except (results.ResultsError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "figures":
        for name in args.only or figures.FIGURES:
            print(figures.render(name, loaded, args.out, compute_seconds=args.compute_seconds))
    elif args.command == "report":
        model = args.model.read_text() if args.model else None
        print(report.write(loaded, args.figures, args.out, compute_seconds=args.compute_seconds, model=model))
    else:
        problems = report.check(loaded, args.figures, args.report, compute_seconds=args.compute_seconds,
                                min_measured=args.min_measured)
        for problem in problems:
            print(f"check: {problem}", file=sys.stderr)
        if problems:
            return 1
        print(f"check: every figure ({len(figures.FIGURES)}) and every claim row is in {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
