"""phub: a rack-scale parameter server for data-parallel training (a reproduction of PHub, SoCC'18).

    import phub
    kv = phub.connect()                    # roles and addresses come from `phub launch`
    kv.init(key, weights)                  # rank 0's values win
    kv.set_optimizer(phub.NAG(learning_rate=0.1, momentum=0.9))
    kv.pushpull(key, grad, out=weights)    # push a gradient, receive the new weights
"""
from .reduction.chunking import ChunkPlan, Topology
from .client.api import Client, connect
from .client.handle import Handle
from .errors import ConfigError, JobFailed, PHubError, PHubTimeout, ProtocolError
from .reduction.optim import NAG, SGD, Aggregate, Optimizer
from .config import JobSpec, ServerConfig
from .server.processes import Server

__version__ = "0.1.0"

__all__ = [
    "connect", "Client", "Handle",
    "NAG", "SGD", "Aggregate", "Optimizer",
    "Server", "ServerConfig", "JobSpec",
    "ChunkPlan", "Topology",
    "PHubError", "ConfigError", "ProtocolError", "JobFailed", "PHubTimeout",
]
