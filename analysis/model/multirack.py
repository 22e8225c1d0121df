"""phub's racks on the wire in the replay (`Job.racks` R > 1): a PBox per rack, reduce-scatter and
all-gather between them, as `phub.reduction.hierarchy` runs it.

The workers are spread evenly over the racks (worker w in rack w // (workers / R)); each rack's
PBox (its K interfaces as one link of K times the rate, as in one rack) aggregates its workers'
copies of a unit. Every chunk has an owner rack and the owners are balanced, so the replay splits
each unit into R equal shares, share o owned by rack o. Then, per unit and rack r:

* r sends its partial of every share o != r to rack o;
* as owner of share r, it waits for the other R - 1 partials, adds them and sends the total to
  every other rack;
* it answers its workers once its own share's total is made and the R - 1 totals of the others'
  shares are in.

A frame between racks crosses the sending PBox's link up, its rack's uplink to the core, the
receiving rack's uplink down and that PBox's link down (`Machine.uplink_bytes_per_s`; None: no
limit there), in pieces that pipeline as every other message does. Each partial and total costs
the sending and the receiving PBox the server's cost of its share, on their server threads.

With no CPU costs (`RoleCosts()`), the replay is the scheme's own time on those links with that
compute: what the links allow an iteration once the order in which backward releases the
gradients and forward needs the weights is kept (`analysis.racks` compares phub with it).
"""
from __future__ import annotations

import simpy

from .replay import PHUB_HEADER_BYTES, Iteration, Link, Node, Unit


class RackIteration(Iteration):
    """`Iteration` with R PBoxes and their uplinks (see the module docstring)."""

    def __init__(self, job, machine, costs):
        super().__init__(job, machine, costs)
        env, racks = self.env, job.racks
        template = self.servers[0]
        rate = template.up.rate if template.up is not None else None
        # Shared cores (this machine) stay shared; a PBox's own cores are its own.
        own = template.cores is not None and not machine.shared_cores

        def cores():
            return simpy.Resource(env, template.cores.capacity) if own else template.cores

        self.servers = [template] + [Node(env, rate, cores(), f"pbox{r}") for r in range(1, racks)]
        self.server_threads = [self.server_threads[0]] + [
            simpy.Resource(env, self.server_threads[0].capacity) for _ in range(1, racks)]
        self.stretch.update({id(t): self.stretch.get(id(self.server_threads[0]), 1.0) for t in self.server_threads})
        uplink = machine.uplink_bytes_per_s
        self.uplinks = [(Link(env, uplink), Link(env, uplink)) if uplink else (None, None) for _ in range(racks)]
        self.per_rack = job.workers // racks

    def rack_of(self, w: int) -> int:
        return w // self.per_rack

    def _server_of(self, w: int, unit: Unit) -> int:
        return self.rack_of(w)

    def _aggregated(self, iteration: int, w: int, unit: Unit):
        rack = self.rack_of(w)
        yield self.mailbox(("local", iteration, unit.group, unit.part, rack), self.per_rack)
        key = ("racks", iteration, unit.group, unit.part, rack)
        runs = self.__dict__.setdefault("_rack_runs", {})
        if key not in runs:
            runs[key] = self.env.process(self._between_racks(iteration, unit, rack))
        yield runs[key]

    def _between_racks(self, iteration: int, unit: Unit, rack: int):
        """Rack `rack`'s part of the exchange between racks for one unit (its local sum is made)."""
        others = [r for r in range(self.job.racks) if r != rack]
        for owner in others:
            self.env.process(self._frame(("partial", iteration, unit.group, unit.part, owner), unit, rack, owner))
        yield self.mailbox(("partial", iteration, unit.group, unit.part, rack), len(others) + 1)
        for other in others:
            self.env.process(self._frame(("total", iteration, unit.group, unit.part, other), unit, rack, other))
        yield self.mailbox(("total", iteration, unit.group, unit.part, rack), len(others) + 1)

    def _frame(self, key, unit: Unit, src: int, dst: int):
        """One share of `unit` from rack src's PBox to rack dst's; counted under `key` on arrival."""
        racks = self.job.racks
        messages, nbytes = unit.messages / racks, unit.nbytes / racks
        seconds = self.costs.server.seconds(messages, nbytes)
        yield from self.cpu(self.server_threads[src], self.servers[src], seconds)
        path = [self.servers[src].up, self.uplinks[src][0], self.uplinks[dst][1], self.servers[dst].down]
        yield self.transfer([link for link in path if link is not None], (f"pbox{src}", f"pbox{dst}"),
                            nbytes + messages * PHUB_HEADER_BYTES)
        yield from self.cpu(self.server_threads[dst], self.servers[dst], seconds)
        self.mailbox(key, racks)
