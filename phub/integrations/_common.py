"""Pieces the framework integrations share: sending the server optimizer only when it changes."""
from __future__ import annotations

import weakref

from ..client.api import Client
from ..reduction.optim import Optimizer

# The optimizer each client last sent. It lives per client, not per integration object, because
# the server keeps one optimizer per job: two kvstores (or a hook and an optimizer) sharing a
# client must see each other's changes.
_last_sent: "weakref.WeakKeyDictionary[Client, Optimizer]" = weakref.WeakKeyDictionary()


def ensure_optimizer(client: Client, optimizer: Optimizer) -> None:
    """Make `optimizer` the job's server optimizer from this worker's next push on.

    Sends nothing when it is already in force (call sites run once per key and step). A chunk's
    round uses the optimizer that the sending worker (rank 0, or each rack's first rank) sent on
    the chunk's lane before its own push, so a switch while one of that worker's earlier pushes
    still waits for slower workers would apply the new optimizer to that round too: a switch
    therefore first waits for this worker's pushes in flight (blocks; raises what
    `Client.wait_all` raises). Sending nothing does not block.
    """
    if _last_sent.get(client) != optimizer:
        client.wait_all()
        client.set_optimizer(optimizer)
        _last_sent[client] = optimizer
