"""phub's protocol, with no I/O: what the frames on a connection mean and what each side answers.

The network paths (`phub.network`) only move bytes; these modules decide. Each is driven by its
side's I/O loop and tested by feeding it frames (`phub.protocol.testing`):

- `wire`          framing: the 32-byte header, data and control frames, `FrameReceiver`
- `messages`      one validator per control message (types and bounds, ProtocolError naming the field)
- `core`          `CoreProtocol`: one server core's connections and jobs (handshake, frames,
                  BYE, failures, stalls, the links to other racks); driven by `phub.server.coreloop`
- `worker`        `WorkerProtocol`: a worker's side (handshake, results, READY, SHARE, ERROR);
                  driven by the client's I/O thread (`phub.client.ioloop`)
- `jobs`          what a core knows of a job and of a connection; `admission`: strangers
- `testing`       the doubles that drive both state machines without sockets or time
- `phub.reduction`'s `aggregation` and `hierarchy`: the per-chunk state machines the core feeds
"""
