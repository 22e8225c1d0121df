"""PHub as an MXNet kvstore: `gluon.Trainer(..., kvstore=phub.integrations.mxnet.create())`.

    import phub.integrations.mxnet as phub_mx
    kv = phub_mx.create()          # connects like phub.connect(): run under `phub launch`
    trainer = gluon.Trainer(net.collect_params(), "nag",
                            {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kv)
    phub_mx.sync_initial_weights(trainer)   # every worker starts from rank 0's weights
    ...
    trainer.step(local_batch_size)
    kv.close()                     # optional: a worker that ends normally leaves the job cleanly

Pass the instance. Importing this module also registers the class with MXNet as ``phub``
(`mx.kv.create("phub")` works), but MXNet 1.9.1's Trainer silently ignores a kvstore given *by
name* when the parameters live on a single device, and then trains alone without a word:
`kvstore="phub"` only takes effect with several devices per worker.

What runs where (MXNet's `update_on_kvstore`):

- ``update_on_kvstore`` True (MXNet's default) with a ``nag`` or ``sgd`` optimizer: the update
  runs on the PHub server, fused with aggregation. Before each key's push the kvstore reads the
  trainer's optimizer exactly as MXNet's own updater would (learning rate from `set_learning_rate`
  or the `lr_scheduler` at the current update count, times the parameter's `lr_mult`; `wd` times
  `wd_mult`; momentum; `rescale_grad`; `clip_gradient`) and sends it to the server when it changed.
  With wd != 0 the server's NAG follows the NAG formula exactly; MXNet 1.9.1's own kernel drifts
  from it slightly (it reads the already-updated weight for the decay term).
- ``update_on_kvstore`` True with any other optimizer (Adam, ...): the server cannot run it, so
  this kvstore aggregates on the server and runs MXNet's own updater on the worker, on the mean
  gradient, just as MXNet's ``local`` kvstore updates inside the store. Every worker applies the
  same update to the same values, so the weights stay identical (a warning says so once).
- ``update_on_kvstore=False``: the server returns the mean gradient (the sum with
  ``reduce="sum"``) and the Trainer updates.

Batch size: each worker calls ``trainer.step(local_batch_size)``; PHub averages over workers (the
server's `rescale_grad` is the trainer's divided by the number of workers), so N workers with
batch b train exactly like one process with batch N*b. MXNet's ``dist_sync`` sums instead:
``create(reduce="sum")`` does the same, so a script written for dist_sync (each worker's
``trainer.step(b)`` on the sum of all workers' gradients) trains as it did there.

Keys may be int or str. Arrays may be NDArrays of any float dtype on any context; they travel as
float32: one copy out of MXNet (`asnumpy`) and one copy back into each output. Every `pushpull`
blocks until its result is written, so the Trainer's next forward pass sees the new weights
(MXNet's engine knows nothing of PHub's transfers). Sparse arrays are not supported.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import sys
from typing import Dict, List, Optional

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from ..client import exiting
from ..reduction import optim
from ..client.api import ENV_SERVER, Client, connect
from ..errors import ConfigError
from ..fileio import atomic_write
from ._common import ensure_optimizer

__all__ = ["PHub", "create", "sync_initial_weights"]

SERVER_STATE = "phub server optimizer state"  # the key of a saved server-side state
log = logging.getLogger(__name__)

# MXNet optimizers the server runs itself, with the phub optimizer that computes the same update.
SERVER_OPTIMIZERS = {mx.optimizer.NAG: optim.NAG, mx.optimizer.SGD: optim.SGD}


def _as_list(values) -> list:
    return list(values) if isinstance(values, (list, tuple)) else [values]


HINT = ("phub: hint: this worker imported phub.integrations.mxnet but never connected to its phub server: "
        "MXNet's Trainer ignores kvstore=\"phub\" given by name when the parameters sit on one device; "
        "pass the instance, kvstore=phub.integrations.mxnet.create()")


def _hint_if_never_connected() -> None:
    """At the exit of a worker `phub launch` started: if it never connected, the likely cause,
    as its last line (the launcher repeats it). Silent outside a launched worker."""
    if ENV_SERVER in os.environ and not exiting.made_a_client():
        print(HINT, file=sys.stderr, flush=True)


atexit.register(_hint_if_never_connected)


@KVStoreBase.register
class PHub(KVStoreBase):
    """A kvstore whose values live on a PHub server (registered in MXNet as ``phub``).

    `client` is an open `phub.Client` (default: `phub.connect()` from the launcher's environment;
    a client passed in is not closed by `close`). `prefix` is prepended to every key, so several
    kvstores can share one client (and job) without their keys colliding. `reduce`: "mean"
    (the default: the workers' gradients are averaged) or "sum" (as MXNet's dist_sync).
    """

    def __init__(self, client: Optional[Client] = None, prefix: str = "", reduce: str = "mean"):
        if reduce not in ("mean", "sum"):
            raise ConfigError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
        self._average = reduce == "mean"
        self._owns_client = client is None
        self._client = connect() if client is None else client
        if self._owns_client:  # a store dropped without close() still leaves the job cleanly
            exiting.close_when_collected(self, self._client)
        self._prefix = prefix
        self._optimizer: Optional[mx.optimizer.Optimizer] = None
        self._server_kind = None  # phub optimizer class when the update runs on the server
        self._updater = None  # MXNet updater when it runs on this worker (MXNet reads this name)
        self._initial: Dict[object, np.ndarray] = {}  # rank 0's initial values, by MXNet key
        self._weights: Dict[object, mx.nd.NDArray] = {}  # the store's weights, worker-side updates only
        self._inits: Dict[object, int] = {}  # MXNet key -> how many times it was initialized

    # -- KVStoreBase properties -----------------------------------------------------------
    @property
    def type(self) -> str:
        # No "dist" in the name: Trainer would then forbid batch-size changes and kvstore resets,
        # which this store handles (the rescale factor is re-sent when it changes).
        return "phub"

    @property
    def rank(self) -> int:
        return self._client.rank

    @property
    def num_workers(self) -> int:
        return self._client.num_workers

    @property
    def client(self) -> Client:
        return self._client

    @staticmethod
    def is_capable(capability: str) -> bool:
        """The store can run an optimizer (``'optimizer'``); ValueError for unknown capabilities."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"unknown capability: {capability}")

    # -- keys -------------------------------------------------------------------------------
    def _key(self, key):
        """The PHub key of an MXNet key: a re-initialized key lives under a fresh one (`key#N`)."""
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise ConfigError(f"MXNet keys must be int or str, got {key!r}")
        again = self._inits.get(key, 1) - 1
        if again:
            return f"{self._prefix}{key}#{again}"
        return f"{self._prefix}{key}" if self._prefix else key

    @staticmethod
    def _pairs(key, value, out):
        """Normalize MXNet's one-key / many-keys call forms to [(key, [values], [outs])]."""
        if isinstance(key, (list, tuple)):
            values = _as_list(value)
            outs = [None] * len(key) if out is None else _as_list(out)
            if not len(key) == len(values) == len(outs):
                raise ConfigError("keys, values and outputs must have the same length")
            return [(k, _as_list(v), None if o is None else _as_list(o)) for k, v, o in zip(key, values, outs)]
        return [(key, _as_list(value), None if out is None else _as_list(out))]

    @staticmethod
    def _to_numpy(values: List[mx.nd.NDArray]) -> np.ndarray:
        """Sum `values` (one array per device) into a fresh float32 numpy array this store owns."""
        for v in values:
            if not isinstance(v, mx.nd.NDArray) or v.stype != "default":
                raise ConfigError(f"the phub kvstore takes dense NDArrays, got {type(v).__name__}"
                                  f"{' (' + v.stype + ')' if isinstance(v, mx.nd.NDArray) else ''}")
        total = values[0].asnumpy().astype(np.float32, copy=False)
        for v in values[1:]:
            total += v.asnumpy()
        return np.ascontiguousarray(total)

    # -- the KVStore API --------------------------------------------------------------------
    def broadcast(self, key, value, out, priority=0) -> None:
        """Register `key` with rank 0's `value` and write that value into `out` (an NDArray or a
        list, one per device). Blocks until every worker has registered the key.

        A key initialized before is initialized again, as MXNet's stores do: its value becomes
        rank 0's new `value` on every worker and its server-side optimizer state (momentum)
        starts afresh. PHub registers it anew under a fresh server key (the old one's memory
        stays allocated on the server, counted against its `--max-job-bytes`)."""
        del priority  # the server serves chunks as they come
        for k, values, outs in self._pairs(key, value, out):
            self._init_key(k, values[0], outs or [])

    def init(self, key, value) -> None:
        """Register `key` (or a list of keys) with rank 0's `value`; blocks like `broadcast`."""
        for k, values, _ in self._pairs(key, value, None):
            self._init_key(k, values[0], [])

    def _init_key(self, key, value: mx.nd.NDArray, outs) -> None:
        self._key(key)  # checks the key's type before anything changes
        array = self._to_numpy([value]).reshape(value.shape)
        self._inits[key] = self._inits.get(key, 0) + 1
        self._client.init(self._key(key), array)  # array now holds rank 0's values
        self._initial[key] = array  # kept: a worker-side updater starts from it
        self._weights.pop(key, None)  # ... from the new value, after a re-initialization
        if self._updater is not None:
            self._updater.states.pop(key, None)
            self._updater.states_synced.pop(key, None)
        for o in outs:
            o[:] = array

    def pushpull(self, key, value, out=None, priority=0) -> None:
        """Push the gradient `value` (summed over its devices) and write the result into `out`
        (default: `value`): the new weights when an optimizer is set, else the mean gradient (the
        sum with reduce="sum").

        Blocks until the result is written. Raises ConfigError for an unknown key or a size
        mismatch, and what `phub.Client.pushpull` raises (JobFailed, PHubTimeout).
        """
        del priority
        for k, values, outs in self._pairs(key, value, out):
            if k not in self._initial:
                raise ConfigError(f"key {k!r} was not initialized (call broadcast or init first)")
            grad = self._to_numpy(values)
            self._select_server_optimizer(k)
            result = self._client.pushpull(self._key(k), grad)  # in place: grad now holds the result
            if self._updater is not None:
                result = self._update_here(k, result)
            for o in outs or values:
                o[:] = result.reshape(o.shape)

    def _update_here(self, key, mean_grad: np.ndarray) -> np.ndarray:
        """Run the MXNet updater on this worker's copy of the weights, as a local kvstore does."""
        weight = self._weights.get(key)
        if weight is None:
            weight = self._weights[key] = mx.nd.array(self._initial[key], ctx=mx.cpu(), dtype=np.float32)
        self._updater(key, mx.nd.array(mean_grad.reshape(weight.shape), ctx=weight.context), weight)
        return weight.asnumpy()

    def set_optimizer(self, optimizer: mx.optimizer.Optimizer) -> None:
        """Use `optimizer` for every following push (MXNet calls this when `update_on_kvstore`).

        NAG and SGD run on the server; any other optimizer runs on each worker after the server
        averaged the gradients (with a warning). Does not block; ConfigError if `optimizer` is
        not an MXNet optimizer.
        """
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise ConfigError(f"set_optimizer takes an mxnet.optimizer.Optimizer, got {optimizer!r}")
        self._optimizer = optimizer
        # Exact types: a subclass may change the update rule the server would not know about.
        self._server_kind = SERVER_OPTIMIZERS.get(type(optimizer))
        if self._server_kind is None:
            names = ", ".join(sorted(c.__name__ for c in SERVER_OPTIMIZERS))
            log.warning("phub: the server runs only %s; %s will run on every worker after the server "
                        "averages the gradients", names, type(optimizer).__name__)
            self._updater = mx.optimizer.get_updater(optimizer)
        else:
            self._updater = None

    def _select_server_optimizer(self, key) -> None:
        """Send what the server must run for `key`'s next round, if it changed."""
        opt = self._optimizer
        if self._server_kind is None:  # the server averages; the update, if any, happens here
            ensure_optimizer(self._client, optim.Aggregate(average=self._average))
            return
        # What MXNet's updater does before each update: count it (drives lr_scheduler), then read
        # the per-key learning rate and weight decay.
        opt._update_count(key)
        clip = opt.clip_gradient if opt.clip_gradient is not None and opt.clip_gradient > 0 else -1.0
        ensure_optimizer(self._client, self._server_kind(
            learning_rate=float(opt._get_lr(key)), momentum=float(opt.momentum), wd=float(opt._get_wd(key)),
            rescale_grad=float(opt.rescale_grad) / (self.num_workers if self._average else 1),
            clip_gradient=float(clip)))

    # -- optimizer state ------------------------------------------------------------------
    def save_optimizer_states(self, fname, dump_optimizer=False) -> None:
        """Save the optimizer state to `fname` (atomically): with the optimizer on the server,
        every key's momentum as the server holds it after this worker's last pushpull (see
        `Client.optimizer_state`; blocks for one round trip); with a worker-side optimizer, the
        MXNet updater's own states."""
        if self._updater is None:
            state = self._client.optimizer_state()
            mine = {key: state[self._key(key)] for key in self._inits}
            payload = pickle.dumps({SERVER_STATE: mine})
        else:
            payload = self._updater.get_states(dump_optimizer)
        atomic_write(fname, lambda path: path.write_bytes(payload))

    def load_optimizer_states(self, fname) -> None:
        """Load a state saved by `save_optimizer_states`. A server-side state goes to the server
        (rank 0's call takes effect; call it after the keys' init and before their next push,
        as Gluon's Trainer.load_states does); ConfigError for a file of the other kind or a key
        this store has not initialized."""
        with open(fname, "rb") as f:
            states = f.read()
        try:
            server_state = pickle.loads(states).get(SERVER_STATE) if states[:1] == b"\x80" else None
        except (pickle.UnpicklingError, EOFError, AttributeError):
            server_state = None
        if server_state is not None:
            if self._updater is not None:
                raise ConfigError(f"{fname} holds the phub server's optimizer state, but {type(self._optimizer).__name__} "
                                  "runs on the workers")
            unknown = [key for key in server_state if key not in self._inits]
            if unknown:
                raise ConfigError(f"{fname}: keys {unknown} were not initialized in this store")
            self._client.load_optimizer_state({self._key(k): v for k, v in server_state.items()})
            return
        if self._updater is None:
            raise ConfigError(f"{fname} does not hold the phub server's optimizer state (the optimizer runs there)")
        try:
            self._updater.set_states(states)
        except (pickle.UnpicklingError, EOFError) as exc:
            raise ConfigError(f"{fname} does not hold MXNet optimizer states: {exc}") from None

    def close(self) -> None:
        """Finish in-flight work and close the client if this store opened it. Idempotent.
        Optional, as with MXNet's stores: a store this process no longer references, and at the
        latest the process's normal exit, close it the same way (see phub/client/exiting.py)."""
        if self._owns_client:
            self._client.close()


def sync_initial_weights(trainer: "mx.gluon.Trainer") -> None:
    """Give every worker rank 0's weights now, before the first forward pass.

    MXNet's Trainer registers the weights with its kvstore lazily, inside the first `step()`,
    i.e. after each worker already computed its first gradient on its *own* initial weights
    (MXNet's dist kvstores behave the same). Call this once after creating the Trainer (every
    worker, same order) unless all workers initialize identically. Parameters whose shape is not
    known yet (deferred initialization) are still registered at the first step. Blocks until
    every worker called it; raises what `broadcast` raises.
    """
    # Trainer has no public hook for this; these are the two calls its step() makes first.
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()


def create(client: Optional[Client] = None, prefix: str = "", reduce: str = "mean") -> PHub:
    """A PHub kvstore for `gluon.Trainer(..., kvstore=create())`: see the module docstring.
    `reduce="sum"` sums the workers' gradients as MXNet's dist_sync does (default: the mean).

    Blocks while connecting (when no `client` is given); raises what `phub.connect()` raises.
    """
    return PHub(client, prefix, reduce)
