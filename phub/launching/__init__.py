"""Starting a job's processes and watching them (what `phub launch`, `phub selftest`, `phub doctor`
and `phub hostfile` run; the commands themselves are parsed in `phub.cli`).

- `launch`      `run_job`: a job's server(s) and N copies of a worker command, on a cluster's nodes
- `hosts`       what several machines add: torch's variables, the cluster a hostfile or a SLURM
                allocation names, a process on a remote-shell node
- `remote`      what runs on a remote-shell node in the command's place (`python -m phub.launching.remote`)
- `supervisor`  the one process supervisor: start a run's processes, pump their output, stop them all
- `cluster`     `Cluster`, `Node`: where the processes run and how a command starts on a node
- `hostfile`    a YAML hostfile, read into a `Cluster`
- `doctor`      what this machine has, and which transports and experiment modes can run
- `selftest`    does this installation work as a parameter server (one small job on loopback)
- `arguments`   what the command lines share: option types, the parser and runner of `phub.cli`
                and of the harness's command
"""
