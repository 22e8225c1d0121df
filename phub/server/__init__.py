"""The server: its processes and the loop each one runs.

- `processes`  `Server`: one process per core, each serving its lanes on every interface;
               started, watched and stopped together
- `coreloop`   `Core`: one core's I/O loop, which moves the bytes of its links (`phub.network`)
               and hands every frame to the core's state machine (`phub.protocol.core`)
"""
