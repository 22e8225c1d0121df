"""How bytes move between workers and server cores; what they mean is `phub.protocol`'s.

- `links`              `Link` and its two subclasses: one non-blocking TCP connection per lane,
                       framed by `protocol.wire`; every transport keeps one for the control frames
- `datapath`           the data-path interface (`ServerPath`, `WorkerPath`) and the registry that
                       picks one by transport name, so no loop branches on the transport
- `tcp`                the TCP data path: pushes and results are data frames on the links
- `rdma`               the verbs data path (transports "verbs" and "soft-verbs")
- `fastpath_contract`  the Python side of the C loops (phub/_fastpath.c): the fields they read
                       and write, checked when the extension loads
"""
