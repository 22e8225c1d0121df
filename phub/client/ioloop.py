"""The worker's I/O thread: the half of `phub.Client` that runs in the background.

One thread per client drives every lane's connection from one selector: it sends what the caller
queued (`_submit`, woken through a socket pair) and hands what arrives to the worker's protocol
(`protocol.worker.WorkerProtocol`: RESULTs land straight in the caller's output arrays, READYs
and SHAREs wake their waiters). On a lost connection or an ERROR frame it fails every waiting
handle with `JobFailed` naming the cause; which cause is this loop's to find out, as it means
reading the other lanes (`_lost_lane`). Mixed into `phub.client.api.Client`.
"""
from __future__ import annotations

import select
import time
from typing import List

from ..protocol import wire
from ..errors import JobFailed, ProtocolError
from ..protocol.worker import ServerReportedError
from ..network.links import Link, LinkClosed, flush_links


_JUDGE_S = 1.0  # how long a failing worker waits for its other lanes to say how they ended


class ClientLoop:
    """Client methods that run on (or feed) the I/O thread; uses the Client's links and state."""

    def _submit(self, frames: List[tuple]) -> None:
        """Queue (sender, *parts) items for the I/O thread: it calls sender.send(*parts)."""
        self._commands.append(frames)
        self._wake()

    def _to_all_lanes(self, frame: bytes) -> None:
        self._submit([(link, frame) for link in self._links])

    def _wake(self) -> None:
        with self._lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _abort(self, message: str) -> None:
        """Tell the server this worker gives up (best effort), so the others stop at once."""
        self._to_all_lanes(wire.control_frame(wire.Kind.ERROR, self.job_id, self.rank, {"message": message}))

    def _on_frame(self, lane: int, link: Link, frame: wire.Frame) -> None:
        try:
            self._protocol.frame_received(lane, frame)
        except ServerReportedError as exc:
            lost = self._lost_lane(besides=link)
            if lost:  # the root cause: a core died, and a sibling core reported what followed
                raise JobFailed(f"lost the phub server ({lost}); the server then reported: {exc}") from None
            raise JobFailed(str(exc)) from None

    def _io_loop(self) -> None:
        try:
            while True:
                nap = self._data.nap if self._data.nap is not None and self._protocol.expect else 1.0
                for key, mask in self._selector.select(timeout=nap):
                    if key.data is None:
                        self._drain_commands()
                    else:
                        key.data.service(mask)
                if self._data.nap is not None:  # results may land outside the links (RDMA writes)
                    self._data.deliver(self._protocol.expect)
                flush_links(self._outbox)
                if self._closing and not self._commands and not any(l.outq for l in self._links):
                    return
        except LinkClosed as exc:
            if not self._closing:
                try:
                    self._salvage()
                except JobFailed as reason:
                    self._protocol.fail(reason)
                    return
                self._protocol.fail(JobFailed(f"lost the phub server ({exc}); it may have stopped after another worker failed"))
        except (JobFailed, ProtocolError) as exc:
            self._protocol.fail(exc if isinstance(exc, JobFailed) else JobFailed(f"protocol error from the server: {exc}"))
        except Exception as exc:  # a bug: fail loudly rather than hang the caller
            self._protocol.fail(JobFailed(f"phub I/O thread crashed: {type(exc).__name__}: {exc}"))

    def _lost_lane(self, besides: Link) -> str:
        """After one core's ERROR, read the other lanes until each ends (an ERROR frame, or the
        connection), for at most `_JUDGE_S`: the first one that broke without an ERROR, as
        'lane N <why>', or '' if none did. A core killed outright sends nothing, and its close can
        sit behind the results it had queued, so a sibling core's ERROR about the workers it took
        down can arrive first; every live core ends a failed job with an ERROR of its own."""
        if self._judging:  # an ERROR met while reading the other lanes: that lane ended properly
            return ""
        self._judging = True
        pending = [link for link in self._links if link is not besides and not link.closed]
        deadline = time.monotonic() + _JUDGE_S
        try:
            while pending and time.monotonic() < deadline:
                readable, _, _ = select.select([link.sock for link in pending], [], [],
                                               max(0.0, deadline - time.monotonic()))
                for link in [link for link in pending if link.sock in readable]:
                    try:
                        link.on_readable()
                        continue
                    except LinkClosed as exc:
                        return f"lane {self._links.index(link)} {exc}"
                    except (JobFailed, ProtocolError, OSError):
                        pending.remove(link)
            return ""
        finally:
            self._judging = False

    def _salvage(self) -> None:
        """After a broken connection, read what the server sent before closing it: usually an
        ERROR frame naming the cause (raised as JobFailed). The kernel keeps those bytes even
        when our own send was what failed."""
        for link in self._links:
            try:
                link.on_readable()
            except (LinkClosed, ProtocolError, OSError):
                continue

    def _drain_commands(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        with self._lock:
            self._wake_pending = False
        while self._commands:
            for item in self._commands.popleft():
                item[0].send(*item[1:])
