"""What a server does with the chunks: cut keys into chunks, sum and update them, across racks.

- `chunking`     `Topology`, `ChunkPlan`: how a key's elements become chunks, each owned by one
                 (interface, core) lane
- `aggregation`  the per-chunk state machine of one rack: slots, rounds, results (`JobState`)
- `hierarchy`    the same across racks: partial sums to the other racks, totals back
- `optim`        the optimizers the server runs on each summed chunk (`SGD`, `NAG`, `Aggregate`)
- `kernels`      the loops over the arrays (C in phub/_fastkernels.c, numpy as the reference),
                 and the dtype checks that arrays pass on their way in (`as_float32`)
"""
