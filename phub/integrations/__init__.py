"""Train real models through PHub from a deep-learning framework.

Import the one you use explicitly (neither framework is a dependency of phub itself):

- `phub.integrations.mxnet`: a `mxnet.kvstore.KVStoreBase` registered as ``phub``, for
  `gluon.Trainer(..., kvstore=phub.integrations.mxnet.create())`; NAG and SGD run on the server.
- `phub.integrations.torch`: a DDP communication hook (aggregation on the server, averaged
  gradients back) and `ServerOptimizer`, which runs NAG/SGD on the server for plain training loops.

The check that training through them follows single-process training is the harness's
(`experiments.convergence`).
"""
