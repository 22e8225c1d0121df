"""Atomic file output: write to a temporary file beside the target, then rename it into place,
so that a killed process never leaves a half-written file (a hostfile `phub hostfile --out`
writes, an MXNet optimizer checkpoint; the harness's results, figures and reports)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Union

PathLike = Union[str, Path]


def atomic_write(path: PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` with a temporary path in the target's directory, then rename it to `path`
    (the directory is created if needed). If `write` raises, no file is left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text(path: PathLike, text: str) -> Path:
    """Write `text` to `path` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text))
