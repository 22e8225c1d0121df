"""What a server does with the chunks: cut keys into chunks, sum and update them, across racks.

- `chunking`     `Topology`, `ChunkPlan`: how a key's elements become chunks, each owned by one
                 (interface, core) lane; `as_float32`, the check every array passes on its way in
- `aggregation`  the per-chunk state machine of one rack: slots, rounds, results (`JobState`)
- `hierarchy`    the same across racks: partial sums to the other racks, totals back
- `optim`        the optimizers the server runs on each summed chunk (`SGD`, `NAG`, `Aggregate`)
- `kernels`      the loops over the arrays (C in phub/_fastkernels.c, numpy as the reference)
"""
