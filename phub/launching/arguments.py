"""What the command lines share: the argparse types of phub's options, and the parser and runner
that make a usage error or a failed command one line naming the command. `phub` (`phub.cli`)
and the harness's `python -m experiments` are both built on them."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..errors import ConfigError, PHubError


def comma_list(what: str):
    """An argparse type: a comma-separated list of at least one `what`."""
    def parse(text: str):
        items = tuple(part.strip() for part in text.split(",") if part.strip())
        if not items:
            raise argparse.ArgumentTypeError(f"give at least one {what}")
        return items
    return parse


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def int_in(low: int, high: int):
    """An argparse type: an integer in [low, high]."""
    def integer(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}], got {value}")
        return value
    return integer


def frame_chunk_bytes(text: str) -> int:
    """An argparse type: a chunk size a frame can carry (whole float32 elements)."""
    from ..reduction.chunking import ITEMSIZE, MAX_CHUNK_BYTES

    value = int(text)
    if not ITEMSIZE <= value <= MAX_CHUNK_BYTES or value % ITEMSIZE:
        raise argparse.ArgumentTypeError(f"must be a multiple of {ITEMSIZE} in [{ITEMSIZE}, {MAX_CHUNK_BYTES}] "
                                         f"(what a frame carries), got {value}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a timeout in seconds, as `config.check_timeout` accepts it."""
    from ..config import check_timeout

    try:
        return check_timeout(float(text), "the value")
    except (ValueError, ConfigError) as exc:
        raise argparse.ArgumentTypeError(str(exc) if isinstance(exc, ConfigError) else f"not a number: {text!r}")


def peer_list(text: str):
    """An argparse type: the other racks' servers, HOST:PORT, comma-separated."""
    from ..config import check_peer

    peers = tuple(p.strip() for p in text.split(",") if p.strip())
    try:
        for peer in peers:
            check_peer(peer)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--peers: ", ""))
    return peers


def job_bytes(text: str) -> int:
    """An argparse type: the bytes a job may register."""
    from ..config import MIN_JOB_BYTES

    value = int(text)
    if not MIN_JOB_BYTES <= value <= 1 << 40:
        raise argparse.ArgumentTypeError(f"must be in [{MIN_JOB_BYTES}, {1 << 40}] bytes, got {value}")
    return value


class Parser(argparse.ArgumentParser):
    """Usage errors as one line, `COMMAND: error: ...` naming the option, exit status 2 (as a bad
    value). Subparsers are made of the same class, so a subclass names its own command."""

    command = "phub"

    def error(self, message: str):
        self.exit(2, f"{self.command}: error: {message} (see `{self.prog} --help`)\n")


def run_command(parser: Parser, argv: Optional[List[str]] = None) -> int:
    """Parse `argv` and run the chosen command; its ConfigError exits 2, other phub and OS errors 1,
    each as one line naming the command."""
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, PHubError, OSError) as exc:
        print(f"{parser.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
