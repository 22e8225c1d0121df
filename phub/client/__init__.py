"""The worker's side: the `Client` a training loop calls, in two threads.

- `api`          `Client` and `connect`: what the caller's thread calls (init, pushpull, close);
                 the rule of which thread owns which state is in `Client`'s docstring
- `ioloop`       `ClientLoop`: the I/O thread, which drives every lane's link and hands what
                 arrives to the worker's protocol (`phub.protocol.worker`)
- `sidechannels` `SideChannels`: what travels beside the gradients (share, optimizer state)
- `handle`       `Handle`: an operation in flight, completed by the I/O thread, awaited by the caller
- `exiting`      how a client still open when its process ends leaves its job
"""
