"""Print (or write) the calibrated model's report section:

    python -m analysis.model --results docs/results/points [--out model.md] [--ratios 0.5 1 2]

Reads the run rows and the software-cost rows under --results (analysis.results; the
software-cost rows also from a `software_cost/` folder there), fits the costs, validates and
predicts (analysis.model.section). Takes about a minute on 2 cores (its replays run in a
process pool, one process per core). Exit status 2 names a malformed results file.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from .. import reference, results
from .calibrate import SoftCostError, load_softcost
from .section import model_section
from .validate import CPU_SPEED_RATIOS


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.model", description=__doc__.splitlines()[0])
    parser.add_argument("--results", required=True, help="directory of tidy result CSVs")
    parser.add_argument("--out", help="write the markdown here (atomically) instead of printing it")
    parser.add_argument("--ratios", type=float, nargs="+", default=list(CPU_SPEED_RATIOS),
                        help="the paper's CPU speed over this machine's (default: 0.5 1 2)")
    args = parser.parse_args(argv)
    if any(r <= 0 for r in args.ratios):
        parser.error("--ratios must be positive")
    try:
        loaded = results.load(args.results)
        softcost = getattr(loaded, "software_cost", None)
        if softcost is None or softcost.empty:
            softcost = load_softcost(args.results)
    except (results.ResultsError, SoftCostError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = model_section(loaded.runs, softcost, reference.load(), tuple(args.ratios))
    if not args.out:
        print(text)
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, prefix=f".{out.name}.", delete=False) as handle:
        handle.write(text + "\n")
    os.replace(handle.name, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
