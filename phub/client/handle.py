"""`Handle`: an operation of a `Client` in flight (an asynchronous pushpull, a READY wait)."""
from __future__ import annotations

import threading
from typing import Optional, Sequence

from ..config import check_timeout
from ..errors import PHubTimeout


class Handle:
    """An operation in flight. `wait()` blocks until it is done and returns its result array."""

    __slots__ = ("_client", "_remaining", "_event", "_result", "_what", "_chunks")

    def __init__(self, client, remaining: int, result, what: str, chunks: Sequence[int]):
        self._client = client
        self._remaining = remaining
        self._event = threading.Event()
        self._result = result
        self._what = what
        self._chunks = chunks
        if remaining == 0:
            self._event.set()

    def _arrived(self, count: int = 1) -> None:  # called by the I/O thread only
        self._remaining -= count
        if self._remaining == 0:
            self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None):
        """Block until done (or `timeout` seconds, default the client's); JobFailed / PHubTimeout."""
        timeout = self._client.timeout if timeout is None else check_timeout(timeout)
        if not self._event.wait(timeout):
            self._client._check_failed()
            missing = self._client._awaiting(self._chunks)
            shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
            raise PHubTimeout(f"{self._what} timed out after {timeout:g} s; "
                              f"{self._remaining} result(s) missing (chunks {shown or 'none'}, or a READY)")
        self._client._check_failed()
        return self._result
