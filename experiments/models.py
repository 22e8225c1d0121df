"""The paper's nine models as the compute replay sees them: layers, FLOPs and a compute profile.

Array layouts come from the layout tables (`experiments.layouts`, data/layouts/: every trainable
array in MXNet's key order, with the forward FLOPs of the layer that owns it). Here the arrays are
grouped into layers, and each model gets a compute profile: seconds per iteration on the paper's
GPU (a GTX 1080 Ti) and the batch size per GPU that goes with it, each labelled with where it
comes from:

* ``paper-derived``: the seconds are the compute bar of the paper's time-breakdown chart
  (resnet269, inception-v3, googlenet, alexnet; see data/compute_reference.csv). The batch is the
  power of two nearest to seconds x R / (3 x forward FLOPs per sample), where R is the GPU's
  effective rate below; for resnet269 that is 0.35 s x 44.02 samples/s = 15.4 -> 16.
* ``estimated``: the other five models. Their batch per GPU is assumed (32; 16 for resnext269,
  like resnet269 whose batch the data implies) and the seconds are scaled from FLOPs:
  batch x 3 x forward FLOPs per sample / R (forward + backward ~ 3 x forward).

R, the effective rate: ResNet-269 trains at 44.02 samples/s on the GTX 1080 Ti (printed), at
3 x 40.28 GFLOPs per sample -> 5.32 TFLOP/s.

`synthetic:SIZE_MB` layouts have no FLOPs and no profile: they can only run with compute zero.
"""
from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

from phub.errors import ConfigError
from .layouts import MODELS, Array, data_rows, layout_bytes, layout_rows, load_layout

# Assumed batch sizes per GPU of the models without a paper-derived compute time.
ASSUMED_BATCH = {"vgg11": 32, "vgg19": 32, "resnet18": 32, "resnet50": 32, "resnext269": 16}
BACKWARD_OVER_FORWARD = 2.0  # backward costs ~2x forward, so one iteration ~ 3x forward


@dataclass(frozen=True)
class Layer:
    name: str
    keys: Tuple[int, ...]  # indices of its arrays in the layout (= the keys exchanged)
    forward_gflops: float  # per sample


@dataclass(frozen=True)
class Profile:
    seconds_per_iteration: float  # forward + backward of one batch on the paper's GPU
    batch_per_gpu: int
    provenance: str  # "paper-derived" or "estimated"
    source: str  # in words: what the numbers come from


@dataclass(frozen=True)
class Model:
    name: str
    arrays: Tuple[Array, ...]
    layers: Tuple[Layer, ...]  # forward order
    forward_gflops_per_sample: float  # every operator, parameterized or not
    profile: Optional[Profile]  # None for synthetic layouts

    @property
    def bytes(self) -> int:
        return layout_bytes(list(self.arrays))


@lru_cache(maxsize=None)
def _summary() -> Dict[str, float]:
    """Forward GFLOPs per sample of every model, all operators counted (phub's summary table)."""
    return {row["model"]: float(row["forward_gflops_per_sample"]) for row in layout_rows("summary")}


@lru_cache(maxsize=None)
def reference_values() -> Dict[Tuple[str, str], Tuple[float, str, str]]:
    """(quantity, model) -> (value, source file, provenance), from data/compute_reference.csv."""
    return {(r["quantity"], r["model"]): (float(r["value"]), r["source_file"], r["provenance"])
            for r in data_rows("compute_reference.csv")}


def effective_gflops_per_s() -> float:
    """The paper GPU's effective rate: ResNet-269's printed samples/s x 3 x its forward FLOPs."""
    samples_per_s = reference_values()[("training_samples_per_s", "resnet269")][0]
    return samples_per_s * (1 + BACKWARD_OVER_FORWARD) * _summary()["resnet269"]


def _nearest_power_of_two(x: float) -> int:
    return 2 ** max(0, round(math.log2(x)))


def compute_profile(name: str) -> Profile:
    """The compute profile of one of the nine models (see the module docstring)."""
    rate = effective_gflops_per_s()
    per_sample = (1 + BACKWARD_OVER_FORWARD) * _summary()[name] / rate  # seconds per sample
    known = reference_values().get(("compute_seconds_per_iteration", name))
    if known is not None:
        seconds, source_file, provenance = known
        return Profile(seconds, _nearest_power_of_two(seconds / per_sample), "paper-derived",
                       f"{source_file} compute bar ({provenance}); batch implied at {rate / 1e3:.2f} TFLOP/s")
    batch = ASSUMED_BATCH[name]
    return Profile(batch * per_sample, batch, "estimated",
                   f"assumed batch {batch} x 3 x {_summary()[name]:.2f} GFLOPs per sample at {rate / 1e3:.2f} TFLOP/s")


def _group_layers(rows: List[dict]) -> Tuple[Layer, ...]:
    """Consecutive arrays consumed by the same operator form one layer."""
    layers: List[Layer] = []
    keys: List[int] = []
    for index, row in enumerate(rows):
        if keys and rows[keys[0]]["layer"] != row["layer"]:
            layers.append(Layer(rows[keys[0]]["layer"], tuple(keys),
                                sum(float(rows[k]["layer_forward_gflops"] or 0) for k in keys)))
            keys = []
        keys.append(index)
    layers.append(Layer(rows[keys[0]]["layer"], tuple(keys),
                        sum(float(rows[k]["layer_forward_gflops"] or 0) for k in keys)))
    return tuple(layers)


def load_model(name: str) -> Model:
    """One of the nine models, or `synthetic:SIZE_MB` (one layer, no compute); ConfigError otherwise."""
    arrays = tuple(load_layout(name))  # validates the name, with the list of valid ones
    if name not in MODELS:
        return Model(name, arrays, (Layer("synthetic", tuple(range(len(arrays))), 0.0),), 0.0, None)
    rows = layout_rows(name)
    if len(rows) != len(arrays):
        raise ConfigError(f"model {name}: the layout lists {len(rows)} rows but phub loaded {len(arrays)} arrays")
    return Model(name, arrays, _group_layers(rows), _summary()[name], compute_profile(name))


def scaled(model: Model, scale: Optional[dict]) -> Model:
    """The model as an emulated rack runs it (DESIGN.md, "Local default"): every array divided by
    s_m (`scale["model"]`, at least one element each) and compute time divided by s_t
    (`scale["time"]` = s_m / s_n), so that communication : compute keeps the paper's ratio on
    links slowed down by s_n. No scale (loopback, a cluster) returns the model unchanged."""
    if not scale or (scale.get("model", 1) == 1 and scale.get("time", 1) == 1):
        return model
    s_m, s_t = float(scale["model"]), float(scale["time"])
    arrays = tuple(Array(a.name, (scaled_elements(a.elements, s_m),), a.forward_gflops) for a in model.arrays)
    profile = model.profile and dataclasses.replace(model.profile,
                                                    seconds_per_iteration=model.profile.seconds_per_iteration / s_t)
    return dataclasses.replace(model, arrays=arrays, profile=profile)


def scaled_elements(elements: int, s_m: float) -> int:
    """An array of `elements` as a rack that divides models by s_m holds it: round(elements / s_m)
    (Python's round, halves to even), at least one. Element-count knobs of the systems (MXNet's
    big-array bound) scale the same way, so an array at the knob's value stays at it."""
    return max(1, round(elements / s_m))


PAPER_CHUNK_BYTES = 32768  # the paper's key chunk (32 KB, 8,192 float32)


def scaled_chunk(paper_bytes: float, s_m: float) -> int:
    """The real chunk that a paper-equivalent chunk of `paper_bytes` becomes when models are
    divided by s_m: whole float32 elements, at least one, rounded down (never fewer chunks)."""
    return max(4, int(paper_bytes / s_m / 4) * 4)


def chunks_per_worker(model: Model, chunk_bytes: int) -> int:
    """How many chunks one worker pushes per exchange of `model` (every array cut at chunk_bytes)."""
    per_chunk = max(1, chunk_bytes // 4)
    return sum(math.ceil(a.elements / per_chunk) for a in model.arrays)


def compute_schedule(model: Model, compute: str) -> Tuple[List[float], List[float]]:
    """Seconds of forward and of backward per layer (forward order) for `compute` = zero | replay.

    Replay spreads the profile's seconds per iteration over the layers by their FLOPs: a third to
    forward, two thirds to backward (operators without parameters ride along with the layers).
    """
    if compute == "zero":
        return [0.0] * len(model.layers), [0.0] * len(model.layers)
    if compute != "replay":
        raise ConfigError(f"--compute {compute}: choose zero or replay")
    if model.profile is None:
        raise ConfigError(f"model {model.name} has no compute profile; use --compute zero")
    total = sum(layer.forward_gflops for layer in model.layers)
    forward = model.profile.seconds_per_iteration / (1 + BACKWARD_OVER_FORWARD)
    shares = [layer.forward_gflops / total for layer in model.layers]
    return [forward * s for s in shares], [forward * BACKWARD_OVER_FORWARD * s for s in shares]


def profile_table() -> List[dict]:
    """One row per model: FLOPs, bytes, compute seconds, batch, provenance (for docs and figures)."""
    rows = []
    for name in MODELS:
        model = load_model(name)
        p = model.profile
        rows.append({"model": name, "forward_gflops_per_sample": round(model.forward_gflops_per_sample, 3),
                     "bytes": model.bytes, "compute_seconds_per_iteration": round(p.seconds_per_iteration, 4),
                     "batch_per_gpu": p.batch_per_gpu, "provenance": p.provenance, "source": p.source})
    return rows


if __name__ == "__main__":
    import json

    for row in profile_table():
        print(json.dumps(row))
