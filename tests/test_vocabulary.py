"""One vocabulary: an option name means one thing in every command (phub's and the harness's,
`python -m experiments`), and every option the README and the docs pages show on a command line
is one that command takes (the dated notebooks keep the commands of their day)."""
import argparse
import re
from collections import defaultdict
from pathlib import Path

from experiments.cli import build_parser as build_harness_parser
from phub.cli import build_parser

HARNESS = "python -m experiments"

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {"lab-notes.md", "data-path-log.md"}
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in NOTEBOOKS)


def _commands(parser: argparse.ArgumentParser, name: str = "phub"):
    """(full command name, its parser) for every command and subcommand."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _commands(subparser, f"{name} {sub}")


def _all_commands():
    yield from _commands(build_parser())
    yield from _commands(build_harness_parser(), HARNESS)


def _meaning(action: argparse.Action) -> tuple:
    return action.dest, type(action).__name__, getattr(action.type, "__name__", None), action.nargs


def test_no_option_name_has_two_meanings_across_commands():
    meanings = defaultdict(dict)  # option string -> {meaning: commands}
    for command, parser in _all_commands():
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    meanings[option].setdefault(_meaning(action), []).append(command)
    clashes = {option: uses for option, uses in meanings.items() if len(uses) > 1}
    assert not clashes, f"option names with more than one meaning: {clashes}"
    # the names the vocabulary settled on, each in the commands that take it
    assert {"phub server", "phub launch"} == set(*meanings["--interfaces"].values())
    assert "--num-interfaces" in meanings and "--interface-regex" in meanings
    assert set(*meanings["--timeout"].values()) == {"phub server", "phub launch"}


def _readme_uses():
    """(line number, command, option) for each --option written after `phub COMMAND` or `-m
    experiments COMMAND SUBCOMMAND` in the README, up to the end of the command: a code span's
    end, a comment, `--` before the workers' CMD, a table cell's end."""
    pattern = re.compile(r"(\bphub|-m experiments) ((?:bench|rack) [a-z]+|[a-z]+)\b([^`#|]*)")
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in pattern.finditer(line):
                arguments = match.group(3).split(" -- ")[0]
                command = "phub" if match.group(1) == "phub" else HARNESS
                for option in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", arguments):
                    yield f"{page.name}:{number}", f"{command} {match.group(2)}", option


def test_every_option_the_readme_shows_is_one_its_command_takes():
    options = {command: {o for a in parser._actions for o in a.option_strings}
               for command, parser in _all_commands()}
    uses = list(_readme_uses())
    assert len(uses) > 30  # the pattern finds the README's command lines
    wrong = [(number, command, option) for number, command, option in uses
             if option not in options.get(command, ())]
    assert not wrong, f"README or docs lines showing options their command does not take: {wrong}"
