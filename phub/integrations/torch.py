"""PHub for PyTorch: a DDP communication hook, and an optimizer that runs on the server.

DDP, with the server only aggregating (averaged gradients come back; each worker's own
optimizer then updates, exactly as with DDP's default allreduce)::

    import phub.integrations.torch as phub_torch
    client = phub.connect()                        # under `phub launch`
    phub_torch.init_process_group(client)          # DDP still needs one for its own setup
    model = DDP(net)
    phub_torch.register_hook(model, client)        # gradients now travel through PHub

A plain training loop (no DDP), with NAG or SGD running on the server, fused with aggregation::

    opt = phub_torch.ServerOptimizer(net.parameters(), lr=0.1, momentum=0.9, nesterov=True, client=client)
    loss.backward(); opt.step(); opt.zero_grad()   # backward pushes each .grad as it is produced,
                                                   # step() waits for the new weights

Both overlap the exchange with the rest of backward: a bucket (DDP) or a parameter
(`ServerOptimizer`) is pushed as soon as backward has produced its gradient.

Tensors travel as float32. CPU float32 contiguous tensors are sent and received in place (no
copy). Anything else (half precision, float16 or bfloat16; float64; GPU; strided) is converted
once per step, in C by torch's copy kernel, into a float32 host buffer that its key allocates
once, and converted back when the result is in: half precision does not travel in its own width,
because the server sums and runs its optimizer in float32. So N workers' half-precision gradients
are summed without half-precision rounding, and with `ServerOptimizer` the server's weights are
float32 master weights: each step a half-precision parameter receives them rounded to its dtype.
"""
import functools
import itertools
import os
import queue
import threading
import weakref
from datetime import timedelta
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from ..client import exiting
from ..reduction import optim
from ..client.api import Client, connect
from ..errors import ConfigError, PHubError
from ._common import ensure_optimizer

__all__ = ["init_process_group", "PHubHookState", "phub_hook", "register_hook", "ServerOptimizer"]

_store_keys = itertools.count()
MOMENTUM = "phub_momentum"  # ServerOptimizer.state_dict: a parameter's momentum on the server


def init_process_group(client: Client, backend: str = "gloo", timeout: float = 300.0) -> None:
    """Initialize torch.distributed for the workers of `client`'s PHub job (same ranks).

    With MASTER_ADDR and MASTER_PORT set, this is the usual `env://` start. Otherwise rank 0
    opens a TCPStore on a free port of MASTER_ADDR (default 127.0.0.1) and the other workers
    learn the port from it through `Client.share`, so `phub launch` needs no extra
    configuration. Blocks until
    every worker has joined; raises what `torch.distributed.init_process_group` raises.
    """
    rank, world = client.rank, client.num_workers
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        return
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    name = f"torch.store_port.{next(_store_keys)}"
    if rank == 0:
        store = dist.TCPStore(host, 0, world, True, timedelta(seconds=timeout), wait_for_workers=False)
        client.share(name, store.port, timeout)
    else:
        store = dist.TCPStore(host, int(client.share(name, timeout=timeout)), world, False, timedelta(seconds=timeout))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))


def _float32_view(tensor: torch.Tensor) -> Optional[np.ndarray]:
    """A flat float32 numpy view of `tensor` (no copy), or None where there can be none."""
    if tensor.device.type == "cpu" and tensor.dtype == torch.float32 and tensor.is_contiguous():
        return tensor.detach().numpy().reshape(-1)
    return None


def _staged(staging: Dict[str, torch.Tensor], key: str, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s values in `key`'s float32 host buffer (allocated on first use, then reused):
    one pass of torch's conversion kernel, which reads any dtype, device or strides."""
    buffer = staging.get(key)
    if buffer is None or buffer.numel() != tensor.numel():
        buffer = staging[key] = torch.empty(tensor.numel(), dtype=torch.float32)
    buffer.view(tensor.shape).copy_(tensor.detach())
    return buffer


class PHubHookState:
    """What the DDP hook needs: the client, and one PHub key per bucket layout.

    Buckets are keyed by (bucket index, element count). DDP calls the hook for buckets in index
    order on every rank, and rebuilds its buckets once after the first iteration (the same way
    on every rank), so all workers register the same new keys in the same order when the layout
    changes. Results are completed by one helper thread that waits for PHub, in push order.
    """

    def __init__(self, client: Optional[Client] = None, prefix: str = "ddp"):
        self.client = connect() if client is None else client
        self.prefix = prefix
        self.keys: Dict[Tuple[int, int], str] = {}
        self.staging: Dict[str, torch.Tensor] = {}  # float32 buffers of buckets that cannot be viewed
        self._pending: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._complete, name="phub-ddp-hook", daemon=True)
        self._thread.start()

    def key(self, index: int, numel: int) -> str:
        """The bucket's PHub key, registering it (blocks: all workers register together) if new."""
        key = self.keys.get((index, numel))
        if key is None:
            key = f"{self.prefix}.bucket{index}.n{numel}"
            self.client.init(key, np.zeros(numel, np.float32))
            self.keys[(index, numel)] = key
        return key

    def _complete(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            handle, future, buffer, staged = item
            try:
                handle.wait()
                if staged is not None:  # back to the bucket's own dtype and device, one pass
                    buffer.copy_(staged)
                future.set_result(buffer)
            except BaseException as exc:  # the future carries it to DDP's backward
                future.set_exception(exc)

    def close(self) -> None:
        """Stop the helper thread (the client stays open: close it yourself)."""
        self._pending.put(None)
        self._thread.join()


# Real (not string) annotations: DDP checks them when the hook is registered.
def phub_hook(state: PHubHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's mean over all workers, computed by the PHub server.

    Returns at once with a future that the state's helper thread completes when the result is
    in the bucket, so DDP goes on with backward while the bucket travels. A float32 CPU bucket
    travels in place; any other is converted into its key's float32 buffer and back (module
    docstring). Registering a new bucket layout blocks until every worker registered it.
    Errors from PHub (JobFailed, PHubTimeout) surface through the future in DDP's backward.
    """
    ensure_optimizer(state.client, optim.Aggregate(average=True))
    buffer = bucket.buffer()
    key = state.key(bucket.index(), buffer.numel())
    host = _float32_view(buffer)
    staged = None
    if host is None:
        staged = _staged(state.staging, key, buffer)
        host = staged.numpy()
    future: torch.futures.Future = torch.futures.Future()
    handle = state.client.pushpull_async(key, host)  # in place: host receives the mean
    state._pending.put((handle, future, buffer, staged))
    return future


def register_hook(model: torch.nn.parallel.DistributedDataParallel, client: Optional[Client] = None,
                  prefix: str = "ddp") -> PHubHookState:
    """Send `model`'s gradient buckets through PHub; returns the hook's state."""
    state = PHubHookState(client, prefix)
    model.register_comm_hook(state, phub_hook)
    return state


class ServerOptimizer(torch.optim.Optimizer):
    """SGD / Nesterov SGD run by the PHub server on the mean of all workers' gradients.

    Same arguments as `torch.optim.SGD` (no dampening). `nesterov=True` is PHub's NAG, the same
    update as torch's Nesterov SGD; otherwise PHub's SGD, the same as torch's while the learning
    rate is constant (PHub folds the learning rate into the momentum buffer, as MXNet does, so
    after a learning-rate change the two differ). Learning rates are read from `param_groups` at
    every step, so torch's lr schedulers work. With `average=True` (default) the server applies
    1/num_workers to the summed gradients: N workers with batch b train like one with N*b.

    With `overlap=True` (default) a parameter's gradient is pushed as soon as backward has
    produced it (a post-accumulate-grad hook), so the exchange overlaps with the rest of
    backward as DDP's allreduce does. Parameters under SMALL_PARAMETER elements share keys (one
    push for many, once all of a key's gradients are in) through a float32 buffer, from which
    `step()` copies their new weights; a larger float32 parameter has its own key, pushed from
    its `.grad` in place, and its new weights land in it while backward goes on (backward no
    longer reads a parameter whose gradient is complete). Hence, with overlap,
    the gradient that `backward()` leaves is the one pushed: a second backward before `step()`
    (gradient accumulation) raises PHubError, and changing `.grad` (clipping) before `step()`
    has no effect; pass `overlap=False` for those, and then `step()` pushes every gradient.

    Construction registers every parameter with the server and overwrites it with rank 0's
    values (blocks until all workers did the same, in the same order). `step()` blocks until the
    new weights are in the parameters. A parameter without a gradient is pushed as zeros by
    `step()`, so that every worker pushes the same keys (it still decays and keeps its momentum).
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, client: Optional[Client] = None, prefix: str = "param",
                 average: bool = True, overlap: bool = True):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ConfigError(f"lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, {weight_decay}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))
        self.client = connect() if client is None else client
        if client is None:  # its own connection: closed when the optimizer is collected (or at exit)
            exiting.close_when_collected(self, self.client)
        self.average = average
        self._keys = _server_keys(self.param_groups, prefix)
        self._key_of: Dict[torch.Tensor, _ServerKey] = {p: key for key in self._keys for p in key.params}
        self._ready: set = set()  # parameters whose gradient this step has taken (pushed or in a buffer)
        self._inflight: Dict[_ServerKey, tuple] = {}  # this step's pushes: key -> (handle, gradient kept alive)
        for key in self._keys:
            key.gather([p.data for p in key.params])
        self.client.init([key.name for key in self._keys], [key.host() for key in self._keys])  # rank 0's values
        for key in self._keys:
            key.scatter()
        # The parameters' hooks reach the optimizer through a weak reference, and go with it: a
        # model outliving its optimizer must not keep it (and its own client) alive.
        hooks = []
        myself = weakref.ref(self)
        for p in self._key_of:
            if overlap and p.requires_grad:
                # The check runs before the gradient is accumulated into a .grad that is in flight.
                hooks += [p.register_hook(functools.partial(_before_accumulation, myself, p)),
                          p.register_post_accumulate_grad_hook(functools.partial(_after_accumulation, myself))]
        weakref.finalize(self, _remove_hooks, hooks)

    def _server_optimizer(self, group) -> optim.Optimizer:
        rescale = 1.0 / self.client.num_workers if self.average else 1.0
        kind = optim.NAG if group["nesterov"] else optim.SGD
        return kind(learning_rate=float(group["lr"]), momentum=float(group["momentum"]),
                    wd=float(group["weight_decay"]), rescale_grad=rescale)

    def state_dict(self) -> dict:
        """torch's optimizer state dict, with each parameter's momentum as the server holds it
        after this worker's last step (`state[i]["phub_momentum"]`; `Client.optimizer_state`,
        one round trip), for a checkpoint beside the model's own."""
        server = self.client.optimizer_state()
        for key in self._keys:
            for p, start in zip(key.params, key.offsets):
                self.state[p][MOMENTUM] = torch.from_numpy(server[key.name][start:start + p.numel()]
                                                           .reshape(p.shape).copy())
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a `state_dict()` and hand its momenta to the server (rank 0's take effect; a
        parameter without one gets zeros where it shares a key); call it before the next
        backward (with overlap, backward pushes)."""
        super().load_state_dict(state_dict)
        momenta = {}
        for key in self._keys:
            if any(MOMENTUM in self.state[p] for p in key.params):
                momenta[key.name] = np.zeros(key.numel, np.float32)
                for p, start in zip(key.params, key.offsets):
                    if MOMENTUM in self.state[p]:
                        momenta[key.name][start:start + p.numel()] = self.state[p][MOMENTUM].detach().cpu().reshape(-1)
        self.client.load_optimizer_state(momenta)

    def _refuse_second_push(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        if p in self._ready:
            raise PHubError(f"ServerOptimizer(overlap=True) pushed a gradient of key {self._key_of[p].name} "
                            "in an earlier backward and step() has not run since: for gradient accumulation, "
                            "pass overlap=False")

    def _grad_ready(self, p: torch.Tensor) -> None:
        with torch.no_grad():
            self._take(p, p.grad)

    def _take(self, p: torch.Tensor, grad: Optional[torch.Tensor]) -> None:
        """`p`'s gradient (None: zeros) is ready: push its key once all of the key's are."""
        key = self._key_of[p]
        self._ready.add(p)
        if key.buffer is None:  # a float32 parameter alone on its key: pushed from its .grad, in place
            grad = torch.zeros_like(p) if grad is None else grad
            grad_host = _float32_view(grad)
            if grad_host is None:  # a strided gradient: rare, so not cached
                grad_host = grad.detach().to("cpu", torch.float32).contiguous().numpy().reshape(-1)
            self._push(key, grad_host, _float32_view(p.data))
            return
        key.put(p, grad)
        if key.ready == len(key.params):
            self._push(key, key.host(), None)

    def _push(self, key: "_ServerKey", grad: np.ndarray, out: Optional[np.ndarray]) -> None:
        # One optimizer per round: a group's learning rate applies only to its own parameters.
        ensure_optimizer(self.client, self._server_optimizer(key.group))
        self._inflight[key] = (self.client.pushpull_async(key.name, grad, out=out), grad)

    @torch.no_grad()
    def step(self, closure=None):
        """Push the gradients backward has not pushed yet, wait for every new weight; returns
        closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for key in self._keys:  # last layers first, as backward produced them
            for p in key.params:
                if p not in self._ready:
                    self._take(p, p.grad)
        inflight, self._inflight = self._inflight, {}
        self._ready = set()
        for key, (handle, _) in inflight.items():
            handle.wait()
            key.scatter()  # a buffer's new weights into its parameters
            key.ready = 0
        return loss


def _before_accumulation(optimizer: "weakref.ref[ServerOptimizer]", p: torch.Tensor, grad: torch.Tensor) -> None:
    live = optimizer()
    if live is not None:
        live._refuse_second_push(p, grad)


def _after_accumulation(optimizer: "weakref.ref[ServerOptimizer]", p: torch.Tensor) -> None:
    live = optimizer()
    if live is not None:
        live._grad_ready(p)


def _remove_hooks(hooks: list) -> None:
    for hook in hooks:
        hook.remove()


SMALL_PARAMETER = 1 << 16  # elements: smaller parameters share a key, pushed once all are ready
KEY_ELEMENTS = 1 << 20  # elements of such a shared key at most (4 MB)


class _ServerKey:
    """One server key of `ServerOptimizer`: one float32 parameter, pushed and updated in place,
    or parameters in a float32 buffer (several small ones, or one that cannot be viewed as
    float32), each gradient converted into it once and each weight back."""

    def __init__(self, name: str, group: dict, params: list, buffered: bool):
        self.name, self.group, self.params = name, group, params
        self.offsets = list(itertools.accumulate([0] + [p.numel() for p in params[:-1]]))
        self._offset_of = {p: start for p, start in zip(params, self.offsets)}  # by identity
        self.numel = sum(p.numel() for p in params)
        self.buffer = torch.empty(self.numel, dtype=torch.float32) if buffered else None
        self.ready = 0  # parameters whose gradient is in the buffer this step

    def host(self) -> np.ndarray:
        return _float32_view(self.params[0].data) if self.buffer is None else self.buffer.numpy()

    def gather(self, tensors: list) -> None:
        if self.buffer is not None:
            for t, start in zip(tensors, self.offsets):
                self.buffer[start:start + t.numel()].view(t.shape).copy_(t.detach())

    def put(self, p: torch.Tensor, grad: Optional[torch.Tensor]) -> None:
        start = self._offset_of[p]
        part = self.buffer[start:start + p.numel()]
        if grad is None:  # no gradient (unused this step): pushed as zeros, as every worker pushes every key
            part.zero_()
        else:
            part.view(p.shape).copy_(grad.detach())
        self.ready += 1

    def scatter(self) -> None:
        if self.buffer is not None:
            for p, start in zip(self.params, self.offsets):
                p.data.copy_(self.buffer[start:start + p.numel()].view(p.shape))


def _server_keys(param_groups: list, prefix: str) -> List[_ServerKey]:
    """The keys of `param_groups`' parameters, last layers first: a float32 CPU parameter of
    SMALL_PARAMETER elements or more alone and in place; any other alone in a buffer; smaller
    ones of a group together, up to KEY_ELEMENTS a key (one push instead of one per parameter)."""
    keys: List[_ServerKey] = []
    for group in param_groups:
        small: list = []
        for p in reversed(group["params"]):
            if p.numel() >= SMALL_PARAMETER:
                keys.append(_ServerKey(f"{prefix}{len(keys)}", group, [p], _float32_view(p.data) is None))
                continue
            if small and sum(q.numel() for q in small) + p.numel() > KEY_ELEMENTS:
                keys.append(_ServerKey(f"{prefix}{len(keys)}", group, small, True))
                small = []
            small.append(p)
        if small:
            keys.append(_ServerKey(f"{prefix}{len(keys)}", group, small, True))
    return keys
