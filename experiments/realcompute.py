"""Real compute (`--compute real`): every worker trains the actual network through the system under test.

Instead of replaying the paper's GPU time, each worker builds the model from MXNet's gluon model
zoo (not pretrained, 1000 classes as on ImageNet) and trains it on one fixed synthetic batch:
random images and labels, different on every rank, the same in every iteration (so the loss must
fall). The exchanged arrays are the network's trainable parameters, keyed in the order the forward
pass first uses them; BatchNorm's running statistics are not trained and stay local to each worker,
as with MXNet's own kvstore. Every rank initializes its network from a different seed: the systems'
`setup` makes all of them start from rank 0's values, and the verification below would notice if not.

One iteration, timed as in the replay (experiments.replay: from the start of a forward to the start
of the next, with the same warmup and final forward):

* forward, recording for autograd: a hook before each layer waits for the layer's new weights from
  the system and writes them into the network. MXNet's engine runs operators asynchronously, so the
  first layers compute while later layers' weights are still arriving;
* backward: MXNet queues the whole backward pass at once and its engine produces the gradients,
  output layer first. The loop waits for each parameter's gradient in reverse key order and hands
  it to the system at once (`write_gradient` + `push`); consolidated systems (gloo) exchange once
  after the last gradient. Overlap is real but limited: on a CPU the engine's threads and the
  system's I/O compete for the same cores, and MXNet gives no per-layer completion callback, so a
  push starts only when the loop has seen that gradient ready.

Image size: the zoo's full size (224, 299 for inception-v3) on a GPU; on a CPU the smallest size
the architecture builds with (MIN_IMAGE_SIZE: AlexNet's strided convolutions and pools need 63;
VGG's five pools need 32; ResNet's stem and stages halve five times, so below 32 the last stage
sees padding only; inception-v3's closing 8x8 average pool needs the full 299). Global pooling
keeps the ResNet and Inception layouts independent of the image size; AlexNet's and VGG's first
dense layer shrinks with it, so their exchanged bytes are smaller than the paper's.

Verification (`--verify`): no closed-form oracle exists for real training, so the check is weaker:
every rank saves its network's parameters after the final forward (the last exchange's weights as
written back into the net), and the runner requires every rank to match rank 0 within
AGREE_TOLERANCE (relative; bit-identical for systems that send every worker the same bytes).
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from phub.errors import ConfigError, PHubError

from .models import load_model
from .replay import bench_optimizer
from .systems import WorkerSystem

# The paper's model names -> MXNet gluon model zoo names (pre-activation ResNets, as MXNet's symbols).
ZOO_NAMES = {"alexnet": "alexnet", "vgg11": "vgg11", "vgg19": "vgg19", "resnet18": "resnet18_v2",
             "resnet50": "resnet50_v2", "inception-v3": "inceptionv3"}
NOT_IN_ZOO = {"googlenet": "the zoo has no GoogLeNet (Inception v1)",
              "resnet269": "the zoo's ResNets stop at 152 layers",
              "resnext269": "the zoo has no ResNeXt"}
FULL_IMAGE_SIZE = {"inception-v3": 299}  # the others: 224
MIN_IMAGE_SIZE = {"alexnet": 63, "vgg11": 32, "vgg19": 32, "resnet18": 32, "resnet50": 32, "inception-v3": 299}
CPU_BATCH = 4  # the default batch per worker on a CPU (on a GPU: the model's profile batch per GPU)
CLASSES = 1000
SEED = 2018
AGREE_TOLERANCE = 1e-6  # max |w_r - w_0| / max(1, |w_0|) over every parameter
VERIFY_KIND = "workers_agree"


def check_config(model: str, image_size: Optional[int], batch: Optional[int], variant: str) -> None:
    """Raise ConfigError unless `model` has a zoo network that trains at `image_size` (None: the
    default) with `batch` samples per worker (None: the default) under this variant."""
    if model in NOT_IN_ZOO:
        raise ConfigError(f"--compute real: model {model} is not in MXNet's gluon model zoo "
                          f"({NOT_IN_ZOO[model]}); real compute supports {', '.join(ZOO_NAMES)}")
    if model not in ZOO_NAMES:
        raise ConfigError(f"--compute real: {model} has no network to train; choose one of {', '.join(ZOO_NAMES)}")
    if image_size is not None and image_size < MIN_IMAGE_SIZE[model]:
        raise ConfigError(f"--image-size {image_size}: {model} ({ZOO_NAMES[model]}) needs images of at least "
                          f"{MIN_IMAGE_SIZE[model]}x{MIN_IMAGE_SIZE[model]}")
    if batch is not None and batch < 1:
        raise ConfigError(f"--batch {batch}: must be >= 1")
    if variant != "full":
        raise ConfigError(f"--variant {variant} with --compute real: training needs the optimizer's weights "
                          "back (use --variant full)")


@dataclass
class _Layer:
    block: object  # the gluon block that uses the parameters
    keys: List[int]


class Trainee:
    """One worker's zoo network, its synthetic batch, and its trainable parameters in key order.

    Building runs two forwards and one timed forward + backward (before any exchange): the first
    materializes the deferred shapes and records the order in which layers use their parameters.
    """

    def __init__(self, model: str, image_size: Optional[int], batch: Optional[int], rank: int):
        import mxnet as mx
        from mxnet import gluon
        from mxnet.gluon.model_zoo import vision

        self.mx = mx
        gpus = mx.context.num_gpus()
        self.ctx = mx.gpu(rank % gpus) if gpus else mx.cpu()
        self.device = str(self.ctx)
        if image_size is None:
            image_size = FULL_IMAGE_SIZE.get(model, 224) if gpus else MIN_IMAGE_SIZE[model]
        if batch is None:
            batch = load_model(model).profile.batch_per_gpu if gpus else CPU_BATCH
        self.image_size, self.batch, self.zoo_name = image_size, batch, ZOO_NAMES[model]
        mx.random.seed(SEED + rank)  # a different initialization per rank: rank 0's must win in setup
        self.net = vision.get_model(self.zoo_name, pretrained=False, classes=CLASSES)
        self.net.initialize(mx.init.Xavier(magnitude=2), ctx=self.ctx)
        rng = np.random.default_rng(SEED + rank)
        self.x = mx.nd.array(rng.uniform(-1, 1, (batch, 3, image_size, image_size)), ctx=self.ctx)
        self.y = mx.nd.array(rng.integers(0, CLASSES, batch), ctx=self.ctx)
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.params, self.layers = [], []
        self._discover()
        self.shapes = [p.shape for p in self.params]
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        self.compute_seconds = self._measure()

    def _discover(self) -> None:
        """One forward with a hook after every block. A block finishes after its children, so each
        parameter is claimed by the innermost block that uses it, in the order forward reaches it."""
        claimed = set()

        def after(block, inputs, output):
            own = [p for p in block.collect_params().values() if p.grad_req != "null" and p.name not in claimed]
            if own:
                claimed.update(p.name for p in own)
                self.layers.append(_Layer(block, list(range(len(self.params), len(self.params) + len(own)))))
                self.params.extend(own)

        handles = []
        self.net.apply(lambda block: handles.append(block.register_forward_hook(after)))
        self.net(self.x).wait_to_read()
        for handle in handles:
            handle.detach()
        unused = [p.name for p in self.net.collect_params().values() if p.grad_req != "null" and p.name not in claimed]
        if unused:  # they would never get a gradient: the layout would not be the trained one
            raise SystemExit(f"{self.zoo_name}: forward never used parameters {', '.join(unused)}")

    def _measure(self) -> float:
        """Seconds of one forward + backward on this device, with no exchange (the second of two)."""
        for _ in range(2):
            start = time.perf_counter()
            self.forward()
            self.mx.nd.waitall()
        return time.perf_counter() - start

    def forward(self, backward: bool = True):
        """Forward (recording), mean loss over the batch, then queue backward (unless told not to); returns the loss
        NDArray (not waited on). Mean: the systems sum the workers' gradients and NAG rescales
        the sum by 1/workers, so each update uses the mean gradient of the global batch."""
        from mxnet import autograd

        with autograd.record():
            loss = self.loss_fn(self.net(self.x), self.y).mean()
        if backward:
            loss.backward()
        return loss

    def attach(self, system: WorkerSystem) -> None:
        """Before each layer's forward: wait for its keys' new weights and write them into the net."""
        def before(block, inputs, keys):
            for key in keys:
                system.wait(key)
                # A synchronous copy into the parameter (not recorded by autograd); MXNet first
                # waits for the operators still reading the old value.
                self.params[key].data(self.ctx)[:] = system.read_weights(key).reshape(self.shapes[key])

        for layer in self.layers:
            layer.block.register_forward_pre_hook(lambda block, inputs, keys=layer.keys: before(block, inputs, keys))

    def hand_over(self, system: WorkerSystem) -> None:
        """Each gradient to the system as soon as the engine has it, last key first."""
        for key in reversed(range(len(self.params))):
            grad = self.params[key].grad(self.ctx).asnumpy()  # blocks until backward produced it
            system.write_gradient(key, grad.reshape(-1))
            if not system.consolidated:
                system.push(key)
        if system.consolidated:
            system.exchange_all()

    def weights(self) -> List[np.ndarray]:
        return [p.data(self.ctx).asnumpy() for p in self.params]


def run(system: WorkerSystem, params: dict) -> dict:
    """Train for warmup + iterations (+1, as the replay) iterations through `system`, then a final
    forward; close the system. Returns this rank's result: the replay's fields plus `losses` (one
    per forward, the final one included), `bytes`, `zoo_model`, `image_size`, `batch`, `device`,
    `compute_seconds`. With verify, first saves the network's final parameters to OUT_DIR/
    real_weights_rankR.npz. Blocks for the whole run; the system's failures propagate."""
    trainee = Trainee(params["model"], params.get("image_size"), params.get("batch"), system.rank)
    initial = trainee.weights()
    system.setup(trainee.sizes, [w.reshape(-1) for w in initial], bench_optimizer(system.num_workers))
    del initial
    trainee.attach(system)
    warmup, iterations = params["warmup"], params["iterations"]
    marks, losses = [], []
    for _ in range(warmup + iterations + 1):
        marks.append(time.perf_counter())
        losses.append(trainee.forward())
        trainee.hand_over(system)
    marks.append(time.perf_counter())
    losses.append(trainee.forward(backward=False))  # the final forward: the last exchange's weights
    losses = [float(loss.asscalar()) for loss in losses]
    if params["verify"]:
        np.savez(os.path.join(params["out_dir"], f"real_weights_rank{system.rank}.npz"), *trainee.weights())
    system.close()
    return {"rank": system.rank, "seconds": [b - a for a, b in zip(marks, marks[1:])][warmup + 1:],
            "verified": bool(params["verify"]), "max_error": None, "losses": losses,
            "bytes": 4 * sum(trainee.sizes), "zoo_model": trainee.zoo_name, "image_size": trainee.image_size,
            "batch": trainee.batch, "device": trainee.device, "compute_seconds": trainee.compute_seconds}


def disagreement(out_dir: str, workers: int) -> float:
    """The largest relative difference of any rank's final parameters from rank 0's (0.0: all
    bit-identical; NaN if any value is NaN). Raises PHubError when a file is missing or the ranks'
    parameter shapes differ."""
    def load(rank):
        try:
            with np.load(os.path.join(out_dir, f"real_weights_rank{rank}.npz")) as f:
                return [f[f"arr_{i}"] for i in range(len(f.files))]
        except FileNotFoundError:
            raise PHubError(f"rank {rank} finished without saving its final weights") from None

    reference = load(0)
    worst = 0.0
    for rank in range(1, workers):
        arrays = load(rank)
        if [a.shape for a in arrays] != [a.shape for a in reference]:
            raise PHubError(f"rank {rank}'s network has other parameter shapes than rank 0's")
        for got, want in zip(arrays, reference):
            error = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
            if np.isnan(error):  # a diverged run: there is no agreement to measure
                return error
            worst = max(worst, error)
    return worst


def row_fields(ranks: List[dict], out_dir: str, verify: bool) -> dict:
    """The row's fields that real compute measures instead of taking from the model's profile:
    bytes and batch per worker, measured compute seconds (the slowest rank's), the loss of every
    forward (mean over the ranks, each on its own batch) and the workers-agree verification."""
    layouts = {(r["bytes"], r["zoo_model"], r["image_size"], r["batch"]) for r in ranks}
    if len(layouts) != 1:
        raise PHubError(f"--compute real: the ranks built different networks or batches: {sorted(layouts)}")
    first = ranks[0]
    losses = [statistics.fmean(values) for values in zip(*(r["losses"] for r in ranks))]
    fields = {"bytes_per_worker": first["bytes"], "batch_per_gpu": first["batch"], "zoo_model": first["zoo_model"],
              "image_size": first["image_size"], "device": first["device"],
              "compute_seconds_per_iteration": max(r["compute_seconds"] for r in ranks),
              "compute_provenance": "measured", "loss_per_iteration": losses,
              "verified": False, "verify_max_error": None, "verify_kind": VERIFY_KIND if verify else None}
    if verify:
        error = disagreement(out_dir, len(ranks))
        fields["verify_max_error"] = error
        fields["verified"] = error <= AGREE_TOLERANCE and all(np.isfinite(losses))  # NaN fails both
    return fields
