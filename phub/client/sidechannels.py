"""What travels beside the gradients: values rank 0 shares with every worker (`share`, a
rendezvous for what is not a tensor) and the server's optimizer state for checkpoints
(`optimizer_state`, `load_optimizer_state`). Mixed into `phub.client.api.Client`; the I/O thread's
side is in protocol/worker.py, the server's in protocol/core.py.
"""
from __future__ import annotations

import time
from typing import Dict, Hashable, Mapping, Optional

import numpy as np

from ..protocol import messages, wire
from ..config import check_timeout
from ..errors import ConfigError
from ..reduction.chunking import as_float32
from .handle import Handle

MAX_SHARE_BYTES = 1 << 20  # a shared value's JSON (see share)


class SideChannels:
    """Client methods beside pushpull (use the Client's plan, links and I/O thread)."""

    def optimizer_state(self, timeout: Optional[float] = None) -> Dict[Hashable, np.ndarray]:
        """The server's optimizer state of every registered key, for a checkpoint: the momentum
        of NAG (or of SGD with momentum), float32 and flat, zeros where there is none. Waits for
        this worker's pushpulls, then asks each lane's server core (at most `timeout` in all,
        default the client's); the state is the one after the last round this worker pushed.
        Any worker may call it (with two-phase reduction its rack's server answers with its
        copy, the same on every rack). Raises PHubTimeout or JobFailed."""
        deadline = time.monotonic() + (self.timeout if timeout is None else check_timeout(timeout))
        self.wait_all(timeout)
        self._check_failed()
        keys = [key for batch in self.plan.batches for key, _ in batch]
        states = {key: np.zeros(self.plan.key_size(key), np.float32) for key in keys}
        handle = Handle(self, len(self.plan.chunks), states, "optimizer_state", [c.id for c in self.plan.chunks])
        for c in self.plan.chunks:
            self._protocol.expect_state[c.id] = (memoryview(states[c.key][c.offset:c.offset + c.size]).cast("B"), handle)
        self._to_all_lanes(wire.control_frame(wire.Kind.STATE_REQUEST, self.job_id, self.rank, {}))
        return handle.wait(max(deadline - time.monotonic(), 0.001))

    def load_optimizer_state(self, states: Mapping[Hashable, np.ndarray]) -> None:
        """Resume from a checkpoint: set the server's optimizer state of the keys in `states`
        (as `optimizer_state` returned it). Like `set_optimizer`, only the server's first
        worker's call takes effect (rank 0, or each rack's first rank); every worker may call
        it. Call it after `init` and `set_optimizer` and before the keys' next pushpull: on TCP
        it travels ahead of them and the call does not block; on an RDMA transport, where pushes
        do not queue behind it, the first worker waits one round trip (up to the client's
        timeout) until the server holds it. ConfigError for an unknown key or a wrong size."""
        flat = {key: as_float32("optimizer state", key, np.ascontiguousarray(value, dtype=np.float32),
                                 self.plan.key_size(key)).copy() for key, value in states.items()}
        self._check_failed()
        if not self._leader:
            return
        frames = []
        for key, values in flat.items():
            for c in self.plan.key_chunks(key):
                header = wire.pack_header(wire.Kind.STATE, self.job_id, self.rank, c.id, 0, c.nbytes)
                frames.append((self._links[c.lane], header, memoryview(values[c.offset:c.offset + c.size]).cast("B")))
        self._submit(frames)
        if self._data.pushes_overtake_control:  # each lane answers after its loads: then the next pushes may go
            self.optimizer_state()

    def share(self, name: str, value=None, timeout: Optional[float] = None):
        """Rank 0's `value` for `name`, on every worker of the job: a rendezvous for what is not
        a tensor (a port, a run's metadata). Rank 0 passes the value (anything JSON can carry,
        up to 1 MB encoded); every worker, rank 0 included, blocks until the server has handed
        it out (at most `timeout`, default the client's) and gets it back decoded. Each name
        is shared once per job; the others may ask before or after rank 0 shares. Raises
        ConfigError for a bad name or value, PHubTimeout, or JobFailed."""
        if not isinstance(name, str) or not 0 < len(name) <= messages.MAX_SHARE_NAME:
            raise ConfigError(f"share: the name must be a string of 1..{messages.MAX_SHARE_NAME} characters, "
                              f"got {name!r}")
        frame = None
        if self.rank == 0:
            try:
                frame = wire.control_frame(wire.Kind.SHARE, self.job_id, self.rank, {"name": name, "value": value})
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"share {name!r}: the value cannot be sent as JSON: {exc}") from None
            if len(frame) > wire.HEADER_BYTES + MAX_SHARE_BYTES:
                raise ConfigError(f"share {name!r}: the value is {len(frame) - wire.HEADER_BYTES} bytes as JSON "
                                  f"(at most {MAX_SHARE_BYTES})")
        self._check_failed()
        protocol = self._protocol
        with protocol.lock:  # the I/O thread files arriving values under it (WorkerProtocol.frame_received)
            if frame is not None and name in protocol.share_waiters:
                raise ConfigError(f"share {name!r}: rank 0 shared this name already")
            handle = protocol.share_waiters.get(name)
            if handle is None:
                handle = protocol.share_waiters[name] = Handle(self, 0 if name in protocol.shared else 1, None,
                                                            f"share of {name!r}", [])
        if frame is not None:
            self._submit([(self._links[0], frame)])
        handle.wait(timeout)
        return protocol.shared[name]

