"""Atomic file output: write to a temporary file beside the target, then rename it into place,
so that a killed run never leaves a half-written figure or report."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Union


def atomic_write(path: Union[str, Path], write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` with a temporary path in the target's directory, then rename it to `path`."""
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


def write_text(path: Union[str, Path], text: str) -> Path:
    """Write `text` to `path` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text))
