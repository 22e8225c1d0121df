"""The harness's result files (a benchmark's JSON line, a run's CSV points), written atomically
with the library's `phub.fileio.atomic_write`: a killed run never leaves half a file."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from phub.fileio import PathLike, atomic_write, write_text


def write_json(path: PathLike, obj, indent=None) -> Path:
    """Write `obj` as JSON to `path` atomically."""
    return write_text(path, json.dumps(obj, indent=indent))


def write_csv(path: PathLike, rows: Iterable[Mapping[str, object]], columns: Sequence[str]) -> Path:
    """Write `rows` as CSV with a header of `columns` to `path` atomically."""
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows(rows)

    return atomic_write(path, write)
