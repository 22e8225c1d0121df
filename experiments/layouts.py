"""Parameter-array layouts of the paper's nine models (and synthetic ones) for exchanges.

The layouts in `data/layouts/` list every trainable array of each model in MXNet's key order,
built from the PHub authors' MXNet model definitions (see data/layouts/README.md for provenance).
A layout name is one of `MODELS` or `synthetic:SIZE_MB` (one array of SIZE_MB megabytes).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from typing import List, Tuple

from phub.errors import ConfigError

MODELS = ("alexnet", "vgg11", "vgg19", "googlenet", "inception-v3", "resnet18", "resnet50",
          "resnet269", "resnext269")


@dataclass(frozen=True)
class Array:
    name: str
    shape: Tuple[int, ...]
    forward_gflops: float  # of the layer that owns the array (0 on its bias/beta)

    @property
    def elements(self) -> int:
        size = 1
        for dim in self.shape:
            size *= dim
        return size


def load_layout(name: str) -> List[Array]:
    """The arrays of a model (or `synthetic:SIZE_MB`); ConfigError lists the valid names."""
    if name.startswith("synthetic:"):
        try:
            megabytes = float(name.split(":", 1)[1])
        except ValueError:
            megabytes = -1
        if not 0 < megabytes <= 1e6:  # also NaN and infinity
            raise ConfigError(f"model {name!r}: SIZE_MB must be a positive number of megabytes, at most 1e6")
        elements = int(megabytes * 1e6) // 4
        if elements < 1:
            raise ConfigError(f"model {name!r}: SIZE_MB must be a positive number of megabytes")
        return [Array("synthetic", (elements,), 0.0)]
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODELS)} or synthetic:SIZE_MB")
    return [Array(row["name"], tuple(int(d) for d in row["shape"].split("x")),
                  float(row["layer_forward_gflops"] or 0)) for row in layout_rows(name)]


def data_rows(*path: str) -> List[dict]:
    """The rows of a CSV table under the harness's data/ (its `#` comment lines skipped)."""
    text = resources.files("experiments").joinpath("data", *path).read_text()
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


def layout_rows(table: str) -> List[dict]:
    """The rows of one table of data/layouts/ (a model's arrays, or `summary`, `models`)."""
    return data_rows("layouts", f"{table}.csv")


def layout_bytes(arrays: List[Array]) -> int:
    return 4 * sum(a.elements for a in arrays)
