"""What the server does with a chunk once every worker's copy has arrived.

Each class is a validated parameter object that travels to the server as JSON (`to_dict`) and runs
there as one fused kernel per chunk (`apply`). The registry `OPTIMIZERS` maps wire names to classes.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Dict, Type

from ..errors import ConfigError

LOOP_NAG, LOOP_SGD = 1, 2  # the optimizers phub/_fastpath.c runs itself (its OPT_NAG, OPT_SGD)
# What `Optimizer.loop_params` returns, in this order; the C loops read the fields by these names
# (phub/network/fastpath_contract.py). "kind" is the optimizer's loop_kind; the others are its attributes.
LOOP_PARAMS_FIELDS = ("kind", "needs_momentum", "learning_rate", "momentum", "wd", "rescale_grad", "clip_gradient")


def _check(cls_name: str, name: str, value, *, minimum: float = None, positive: bool = False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{cls_name}.{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{cls_name}.{name} must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{cls_name}.{name} must be >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Optimizer:
    name = "base"
    loop_kind = None  # LOOP_NAG or LOOP_SGD: phub/_fastpath.c runs this optimizer itself
    needs_momentum = False
    returns_weights = True  # False: the result is the aggregate itself, not new weights

    def to_dict(self) -> dict:
        return {"name": self.name, **asdict(self)}

    def apply(self, kernels, weight, mom, acc, last, result, num_workers: int) -> None:
        """Update one chunk: `acc` (+ `last`, if not None) is the sum of the workers' gradients."""
        raise NotImplementedError  # pragma: no cover

    def loop_params(self):
        """What a core's C loop needs to run this optimizer itself (phub/_fastpath_rounds.h): a
        tuple of LOOP_PARAMS_FIELDS, or None when it leaves the optimizer to `apply`."""
        if self.loop_kind is None:
            return None
        return tuple(self.loop_kind if name == "kind" else getattr(self, name) for name in LOOP_PARAMS_FIELDS)


@dataclass(frozen=True)
class NAG(Optimizer):
    """MXNet's NAG: g = rescale*g (clipped) + wd*w; mom = momentum*mom + g; g += momentum*mom; w -= lr*g."""

    learning_rate: float = 0.01
    momentum: float = 0.9
    wd: float = 0.0
    rescale_grad: float = 1.0
    clip_gradient: float = -1.0  # <= 0: no clipping
    name = "nag"
    loop_kind = LOOP_NAG
    needs_momentum = True

    def __post_init__(self):
        _check("NAG", "learning_rate", self.learning_rate, minimum=0)
        _check("NAG", "momentum", self.momentum, minimum=0)
        _check("NAG", "wd", self.wd, minimum=0)
        _check("NAG", "rescale_grad", self.rescale_grad)
        _check("NAG", "clip_gradient", self.clip_gradient)

    def apply(self, kernels, weight, mom, acc, last, result, num_workers):
        kernels.nag(weight, mom, acc, last, self.learning_rate, self.momentum, self.wd,
                    self.rescale_grad, self.clip_gradient)


@dataclass(frozen=True)
class SGD(Optimizer):
    """SGD with optional momentum: mom = momentum*mom - lr*(g + wd*w); w += mom (w -= lr*(g + wd*w) without)."""

    learning_rate: float = 0.01
    momentum: float = 0.0
    wd: float = 0.0
    rescale_grad: float = 1.0
    clip_gradient: float = -1.0
    name = "sgd"
    loop_kind = LOOP_SGD

    def __post_init__(self):
        _check("SGD", "learning_rate", self.learning_rate, minimum=0)
        _check("SGD", "momentum", self.momentum, minimum=0)
        _check("SGD", "wd", self.wd, minimum=0)
        _check("SGD", "rescale_grad", self.rescale_grad)
        _check("SGD", "clip_gradient", self.clip_gradient)

    @property
    def needs_momentum(self) -> bool:  # type: ignore[override]
        return self.momentum > 0

    def apply(self, kernels, weight, mom, acc, last, result, num_workers):
        kernels.sgd(weight, mom if self.momentum > 0 else None, acc, last, self.learning_rate,
                    self.momentum, self.wd, self.rescale_grad, self.clip_gradient)


@dataclass(frozen=True)
class Aggregate(Optimizer):
    """No optimizer on the server: return the sum of the workers' gradients (or their mean)."""

    average: bool = False
    name = "aggregate"
    returns_weights = False

    def __post_init__(self):
        if not isinstance(self.average, bool):
            raise ConfigError(f"Aggregate.average must be a bool, got {self.average!r}")

    def apply(self, kernels, weight, mom, acc, last, result, num_workers):
        kernels.scale(result, acc, last, 1.0 / num_workers if self.average else 1.0)


OPTIMIZERS: Dict[str, Type[Optimizer]] = {cls.name: cls for cls in (NAG, SGD, Aggregate)}


def optimizer_from_dict(obj: dict) -> Optimizer:
    """Rebuild an optimizer sent with `to_dict`; ConfigError names any unknown name or field."""
    if not isinstance(obj, dict) or obj.get("name") not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {obj.get('name') if isinstance(obj, dict) else obj!r}; "
                          f"known: {sorted(OPTIMIZERS)}")
    cls = OPTIMIZERS[obj["name"]]
    known = {f.name for f in fields(cls)}
    extra = set(obj) - known - {"name"}
    if extra:
        raise ConfigError(f"optimizer {cls.name!r} has no parameter(s) {sorted(extra)}")
    return cls(**{k: v for k, v in obj.items() if k != "name"})
