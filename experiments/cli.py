"""The harness's command, `python -m experiments`: the benchmarks and the emulated rack.

    python -m experiments bench exchange --system pslite-central --model resnet50 --workers 2
    python -m experiments bench software-cost --out results/points/software_cost
    python -m experiments rack up --spec config/racks/2x2.yaml

The library's own commands (server, launch, selftest, doctor, hostfile) are `phub`'s.
"""
from __future__ import annotations

import json
import sys
from typing import List, Optional

from phub.reduction.chunking import DEFAULT_CHUNK_BYTES
from phub.launching.arguments import Parser, frame_chunk_bytes, int_in, positive_int, run_command, seconds
from phub.config import MAX_CORES, MAX_LANES, MAX_SIMULATED_RACKS, TRANSPORTS
from phub.protocol.messages import MAX_WORKERS

from .rack.rackcli import add_parser as add_rack_parser
from .softcost_run import add_parser as add_software_cost_parser


class HarnessParser(Parser):
    command = "python -m experiments"


def cmd_bench_exchange(args) -> int:
    from .runner import Options, run_exchanges, summary

    options = Options(compute=args.compute, network=args.network, spec=args.spec, cores=args.cores,
                      num_interfaces=args.num_interfaces, racks=args.racks, chunk_bytes=args.chunk_bytes,
                      simulated_racks=args.simulate_racks,
                      lanes_per_pair=args.lanes_per_pair, bigarray_bound=args.bigarray_bound,
                      time_limit=args.time_limit, variant=args.variant,
                      image_size=args.image_size, batch=args.batch, transport=args.transport)

    def report(row: dict) -> None:  # as each repeat ends, so a long run shows progress
        print(summary(row), file=sys.stderr if args.json else sys.stdout, flush=True)
        if args.json:
            print(json.dumps(row), flush=True)

    run_exchanges(args.system, args.model, args.workers, args.iterations, args.warmup, args.verify, options,
                  repeats=args.repeats, on_row=report)
    return 0


def build_parser() -> HarnessParser:
    parser = HarnessParser(prog=HarnessParser.command,
                           description="phub's harness: benchmarks of phub and its baselines, emulated racks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    exchange = bench.add_parser("exchange", help="time exchanges of a model's gradient layout on any system "
                                                  "(phub or a baseline), with an optional compute replay")
    exchange.add_argument("--system", default="phub",
                          help="phub, pshard, pslite-central, pslite-shard or gloo-ring (default phub)")
    exchange.add_argument("--model", default="resnet50", help="model layout, or synthetic:SIZE_MB")
    exchange.add_argument("--workers", type=int_in(1, MAX_WORKERS), default=2)
    exchange.add_argument("--iterations", type=positive_int, default=10)
    exchange.add_argument("--warmup", type=int, default=1)
    exchange.add_argument("--verify", action="store_true", help="check every result against the oracle")
    exchange.add_argument("--json", action="store_true", help="print each result row as JSON (one line per repeat, the last lines)")
    exchange.add_argument("--repeats", type=int_in(1, 1000), default=1,
                          help="blocks of --iterations timed iterations after one --warmup, in one start of the "
                               "processes on one network (one emulated rack); one row (JSON line) each (default 1)")
    exchange.add_argument("--compute", choices=("zero", "replay", "real"), default="zero",
                          help="zero: exchanges only; replay: the model's GPU compute time, overlapped as in "
                               "training; real: train the MXNet model zoo network on synthetic data (default zero)")
    exchange.add_argument("--image-size", type=positive_int, default=None,
                          help="--compute real: image side in pixels (default: full size on a GPU, the "
                               "smallest the model builds with on a CPU)")
    exchange.add_argument("--batch", type=positive_int, default=None,
                          help="--compute real: samples per worker (default: the model's batch per GPU on a GPU, 4 on a CPU)")
    exchange.add_argument("--network", default="loopback",
                          help="where the nodes are: loopback (default), emulated (a rack spec as --spec) or "
                               "hostfile (real machines, a hostfile as --spec)")
    exchange.add_argument("--spec", default=None,
                          help="the network's description file: a rack spec (emulated) or a hostfile (hostfile)")
    exchange.add_argument("--variant", default="full", choices=("full", "no_optimizer", "no_compute"),
                          help="breakdown experiment: run without the optimizer, or label a compute-free run")
    exchange.add_argument("--cores", type=int_in(1, MAX_CORES), default=1, help="phub: server processes per server node")
    exchange.add_argument("--num-interfaces", type=positive_int, default=1,
                          help="phub: interfaces of each PBox (default 1; the other systems use one per node)")
    exchange.add_argument("--racks", type=positive_int, default=1,
                          help="phub on loopback: one PBox per rack, two-phase reduction between them (default 1)")
    exchange.add_argument("--simulate-racks", type=int_in(1, MAX_SIMULATED_RACKS), default=1, metavar="R",
                          help="phub: one PBox stands in for R racks as the paper measured beyond a rack (each "
                               "core sends every aggregated chunk to itself over its own interface and adds it "
                               "again, R times; see `phub server --help`); default 1: off")
    exchange.add_argument("--chunk-bytes", type=frame_chunk_bytes, default=DEFAULT_CHUNK_BYTES,
                          help=f"phub, pshard: key chunk size in bytes (default {DEFAULT_CHUNK_BYTES})")
    exchange.add_argument("--lanes-per-pair", type=int_in(1, MAX_LANES), default=1,
                          help="phub, pshard: connections per worker for each (interface, core) pair")
    exchange.add_argument("--transport", choices=TRANSPORTS, default="tcp",
                          help="phub, pshard: how chunks move (tcp, verbs, or soft-verbs; see `phub server --help`)")
    exchange.add_argument("--bigarray-bound", type=int_in(1, 10**9), default=1000 * 1000,
                          help="pslite: MXNET_KVSTORE_BIGARRAY_BOUND at the paper's scale, in elements (default "
                               "MXNet's 1000000); on an emulated rack that divides arrays by s_m the run uses "
                               "max(1, round(BOUND / s_m)), as for an array of BOUND elements, and its row "
                               "records both (bigarray_bound, bigarray_bound_paper)")
    exchange.add_argument("--time-limit", type=seconds, default=300.0,
                          help="seconds the whole run may take before it fails naming what still runs; "
                               "no wait inside it is longer (default 300)")
    exchange.set_defaults(func=cmd_bench_exchange)
    add_software_cost_parser(bench)

    add_rack_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
