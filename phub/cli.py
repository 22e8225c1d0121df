"""The `phub` command: server, launch, selftest, doctor, hostfile (the benchmarks and the emulated
rack are the harness's: `python -m experiments`)."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import List, Optional

from .reduction.chunking import DEFAULT_CHUNK_BYTES
from .config import TRANSPORTS
from .network.datapath import DEFAULT_TRANSPORT
from .errors import ConfigError
from .launching.arguments import (Parser, comma_list, frame_chunk_bytes, int_in, job_bytes, peer_list,
                                  positive_int, run_command, seconds)


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    from .config import MAX_CORES, MAX_LANES, MAX_PORT, MAX_SIMULATED_RACKS

    parser.add_argument("--cores", type=int_in(1, MAX_CORES), default=1,
                        help="server processes, one per core (default 1)")
    parser.add_argument("--interfaces", type=comma_list("IPv4 address"), default=("127.0.0.1",),
                        help="comma-separated IPv4 addresses the server listens on: the PBox's NICs "
                             "(default 127.0.0.1)")
    parser.add_argument("--port", type=int_in(0, MAX_PORT), default=0,
                        help="base port: core C listens on PORT+C on every interface (default 0: ephemeral)")
    parser.add_argument("--chunk-bytes", type=frame_chunk_bytes, default=DEFAULT_CHUNK_BYTES,
                        help=f"key chunk size in bytes (default {DEFAULT_CHUNK_BYTES})")
    parser.add_argument("--lanes-per-pair", type=int_in(1, MAX_LANES), default=1,
                        help="connections per worker for each (interface, core) pair (default 1)")
    parser.add_argument("--timeout", type=seconds, default=300.0,
                        help="seconds a job may stall, a worker may take to connect, and a blocking worker call "
                             "may wait before it fails (default 300)")
    parser.add_argument("--connect-timeout", type=seconds, default=None,
                        help="seconds a job's workers may take to connect once the first has, before the "
                             "server fails the job naming the missing ranks (default 60, at most --timeout)")
    parser.add_argument("--max-job-bytes", type=job_bytes, default=None,
                        help="bytes of arrays one job may register (default 2 GiB); the server needs about "
                             "(workers + 3) times this in memory")
    parser.add_argument("--simulate-racks", type=int_in(1, MAX_SIMULATED_RACKS), default=1, metavar="R",
                        help="one PBox stands in for R racks, as the paper measured beyond a rack: each core "
                             "sends every aggregated chunk through its own interface back to itself and adds "
                             "it again, R times, before the optimizer (default 1: off)")


def _add_transport_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=TRANSPORTS, default=DEFAULT_TRANSPORT,
                        help="how chunks move: tcp (default), verbs (RDMA; refused at start, with the "
                             "reason, unless `phub doctor` says it can run here), or soft-verbs (the verbs "
                             "data path in software, between processes of one machine: for testing)")
    parser.add_argument("--rdma-devices", type=comma_list("RDMA port"), default=(),
                        help="with --transport verbs: the RDMA port (NAME[:PORT], see `phub doctor`) serving "
                             "each interface, comma-separated in --interfaces order (default: the first "
                             "usable port for all)")


def _server_config(args, jobs, once: bool):
    from .config import ServerConfig

    return ServerConfig(jobs=tuple(jobs), interfaces=args.interfaces, cores=args.cores, port=args.port,
                        lanes_per_pair=args.lanes_per_pair, chunk_bytes=args.chunk_bytes, once=once,
                        timeout=args.timeout, rack=getattr(args, "rack", 0),
                        peers=tuple(getattr(args, "peers", ()) or ()),
                        transport=getattr(args, "transport", DEFAULT_TRANSPORT),
                        rdma_devices=tuple(getattr(args, "rdma_devices", ()) or ()),
                        report_joins=getattr(args, "report_joins", False),
                        simulated_racks=getattr(args, "simulate_racks", 1),
                        **({"max_job_bytes": args.max_job_bytes} if args.max_job_bytes else {}),
                        **({"connect_timeout": args.connect_timeout} if args.connect_timeout else {}))


def cmd_server(args) -> int:
    from .config import JobSpec
    from .server.processes import Server

    jobs = [JobSpec.parse(text) for text in args.job] or [JobSpec(0, args.workers)]
    server = Server(_server_config(args, jobs, args.once)).start()
    print(json.dumps({"event": "ready", "address": server.address, "endpoints": server.endpoints,
                      "pids": server.pids, "max_job_bytes": server.config.max_job_bytes}), flush=True)

    def terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        return server.wait() or 0
    except KeyboardInterrupt:
        print("phub server: stopping on signal", file=sys.stderr, flush=True)
        return 130
    finally:
        server.stop()


def cmd_launch(args) -> int:
    import os

    from .config import JobSpec
    from .launching.launch import own_python, run_with_restarts

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError("phub launch: give the worker command after --")
    cluster = None
    if args.hostfile or args.from_slurm:
        from .launching.hosts import launch_cluster

        cluster = launch_cluster(args.hostfile, args.from_slurm, args.workers, args.pboxes, args.interface_regex,
                                 args.remote_shell)
    elif args.workers is None:
        raise ConfigError("phub launch: give the number of workers (-n N), or --hostfile FILE / --from-slurm")
    elif args.remote_shell:
        raise ConfigError("phub launch: --remote-shell goes with --hostfile (a hostfile with launcher: ssh)")
    workers = len(cluster.workers) if cluster else args.workers
    unset = [name for name in args.env if name not in os.environ]
    if unset:
        raise ConfigError(f"phub launch: --env {unset[0]}: no such variable in this environment")
    passed = {name: os.environ[name] for name in args.env}
    result = run_with_restarts(own_python(command), workers, _server_config(args, [JobSpec(0, workers)], True),
                               args.max_restarts, cluster=cluster, extra_env=passed)
    if result.status:
        print(f"phub launch: {result.failed}; stopped the other processes", file=sys.stderr)
    elif result.carried:
        print(result.carried, file=sys.stderr)
    return result.status


def cmd_selftest(args) -> int:
    from .launching.selftest import main as selftest_main

    return selftest_main([])


def cmd_doctor(args) -> int:
    from .launching.doctor import main as doctor_main

    return doctor_main(as_json=args.json)


def cmd_hostfile(args) -> int:
    from .launching import hostfile
    from .fileio import write_text

    if args.from_slurm:
        import yaml

        data = hostfile.from_slurm(args.pboxes, args.interface_regex)
        cluster = hostfile.parse_hostfile(data, "<from SLURM>")
        text = yaml.safe_dump(data, sort_keys=False)
        if args.out:
            write_text(args.out, text)
        else:
            sys.stdout.write(text)
    else:
        cluster = hostfile.load_hostfile(args.check)
    for role, nodes in (("pbox", cluster.servers), ("worker", cluster.workers)):
        for node in nodes:
            print(f"{role:>6}  {node.name}  rack {node.rack}  {', '.join(node.addresses)}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .protocol.messages import MAX_WORKERS

    parser = Parser(prog="phub", description="PHub: a rack-scale parameter server")
    sub = parser.add_subparsers(dest="cmd", required=True)

    server = sub.add_parser("server", help="run a server alone (for clusters); prints a JSON 'ready' line")
    _add_server_options(server)
    server.add_argument("--job", action="append", default=[], metavar="ID:WORKERS[:TOKEN]",
                        help="a job to accept (repeatable); default: job 0 with --workers workers")
    server.add_argument("--workers", type=int_in(1, MAX_WORKERS), default=1, help="workers of the default job 0")
    server.add_argument("--once", action="store_true",
                        help="exit when every job has ended (default: serve on; a job whose run ended "
                             "cleanly takes its next run, with the same id)")
    _add_transport_option(server)
    server.add_argument("--rack", type=int, default=0, help="this server's rack (with --peers)")
    server.add_argument("--peers", type=peer_list, default=(),
                        help="two-phase reduction: every rack server's HOST[+HOST...]:PORT (its interfaces' addresses, "
                             "in interface order) in rack order, this one included")
    server.add_argument("--report-joins", action="store_true", help=argparse.SUPPRESS)  # for the launcher
    server.set_defaults(func=cmd_server)

    launch = sub.add_parser(
        "launch", help="start a server and N workers running CMD, on this machine or a hostfile's nodes",
        description="Start a phub server and N workers running CMD (on this machine, or with --hostfile / "
                    "--from-slurm the server on the PBox node(s) and one worker per worker slot); exit 0 once "
                    "every worker exited 0 (whether or not it called close()), else non-zero naming the first "
                    "failure. Workers get PHUB_* and torch's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
                    "MASTER_ADDR, MASTER_PORT. A CMD whose first word is `python` or `python3` runs with this "
                    f"phub's own interpreter ({sys.executable}, the same path on every node), activated or not; "
                    "give a path to run another.")
    launch.add_argument("-n", "--workers", type=int_in(1, MAX_WORKERS), default=None,
                        help="number of workers (with --hostfile/--from-slurm: default every worker slot)")
    hosts_from = launch.add_mutually_exclusive_group()
    hosts_from.add_argument("--hostfile", metavar="FILE",
                            help="run on the nodes FILE names (see `phub hostfile`; launcher srun, ssh or local)")
    hosts_from.add_argument("--from-slurm", action="store_true",
                            help="run on the nodes of the SLURM allocation this runs in, through srun "
                                 "(the first --pboxes nodes serve, the others are workers)")
    launch.add_argument("--pboxes", type=positive_int, default=1, help="--from-slurm: PBox nodes (default 1)")
    launch.add_argument("--interface-regex", metavar="REGEX", default=None,
                        help="--from-slurm: the interfaces to use (default: all but loopback)")
    launch.add_argument("--remote-shell", metavar="TEMPLATE", default=None,
                        help="a hostfile with launcher ssh: the command that runs its last argument (a shell "
                             "command line) on node {node} (address {address}); default the file's remote_shell, "
                             "else 'ssh -o BatchMode=yes {node}'")
    launch.add_argument("--env", action="append", default=[], metavar="NAME",
                        help="pass this environment variable on to every worker (repeatable; ssh nodes get only "
                             "PATH, PYTHONPATH, VIRTUAL_ENV, OMP_NUM_THREADS and PHUB_* otherwise)")
    launch.add_argument("--max-restarts", type=int_in(0, 1000), default=0,
                        help="start the whole job again after a failure, up to this many times (default 0); "
                             "workers read the start's number in PHUB_RESTART_COUNT and resume from their "
                             "own checkpoint")
    _add_server_options(launch)
    _add_transport_option(launch)
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    launch.set_defaults(func=cmd_launch)

    selftest = sub.add_parser("selftest", help="check this installation: the C kernels, and a 2-worker job on "
                                               "loopback whose results are compared with the closed form")
    selftest.set_defaults(func=cmd_selftest)

    doctor = sub.add_parser("doctor", help="what this machine can run: RDMA devices, interfaces, privileges, "
                                           "cores, libraries, transports and experiment modes")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(func=cmd_doctor)

    hosts = sub.add_parser("hostfile", help="real machines: write the hostfile of a SLURM allocation, or check one")
    which = hosts.add_mutually_exclusive_group(required=True)
    which.add_argument("--from-slurm", action="store_true",
                       help="the nodes of the allocation this runs in (first PBoxes, then workers)")
    which.add_argument("--check", metavar="FILE", help="read a hostfile and list its nodes")
    hosts.add_argument("--pboxes", type=positive_int, default=1,
                       help="--from-slurm: PBox nodes, one per rack (default 1)")
    hosts.add_argument("--interface-regex", metavar="REGEX", default=None,
                       help="--from-slurm: use the interfaces whose name matches (default: all but loopback)")
    hosts.add_argument("--out", help="--from-slurm: write the hostfile here (default: stdout)")
    hosts.set_defaults(func=cmd_hostfile)

    return parser


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
