"""What one server core knows about each job and each connection (shared by core.py and racklinks.py)."""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

from .aggregation import JobState
from .config import JobSpec
from .transport import Link


class Job:
    """A job as one core sees it: the aggregation state plus its connections.

    The state is created by the job's first lane HELLO, which says how many shards the workers
    spread the job over and which one this server is (every later HELLO must agree), or, on a
    rack server, by whichever comes first: a worker or another rack.
    """

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.state: Optional[JobState] = None
        self.verbs = None  # the job's verbs data path on this core (rdma.serving.CoreVerbs), if used
        self.shard: Tuple[int, int] = (0, 1)  # (this server's index, number of shards)
        self.links: Dict[int, List[Optional[Link]]] = {}  # lane -> link per local worker
        self.peer_links: Dict[int, Link] = {}  # rack -> link to that rack's server (same core)
        self.rack_backlog: Dict[int, list] = {}  # rack -> frames to send once it has connected
        self.said_bye: set = set()  # (lane, local rank) of workers that closed cleanly
        self.racks_done: set = set()  # racks whose server said it has finished the job
        self.ended: Optional[str] = None  # None while running; "" = finished cleanly; else the error
        self.last_progress = time.monotonic()
        self.stall_reported = False

    def live_links(self):
        for lane_links in self.links.values():
            yield from (link for link in lane_links if link is not None and not link.closed)
        yield from (link for link in self.peer_links.values() if not link.closed)


class Peer:
    """What a server-side connection has proven about itself (nothing until its HELLO)."""

    __slots__ = ("interface", "job", "rank", "local", "lane", "rack")

    def __init__(self, interface: int):
        self.interface = interface
        self.job: Optional[Job] = None
        self.rank = -1  # the worker's rank in the job (-1: another rack's server)
        self.local = -1  # its index among this server's workers
        self.lane = -1
        self.rack = -1  # another rack's index, on a link between rack servers
