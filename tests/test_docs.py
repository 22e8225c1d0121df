"""The README and the pages under docs/: short enough to read, no run figure that can go stale,
no commit hash, links that resolve, and an API reference that builds strictly.

Run figures (wall times, verdict counts, benchmark ratios and rates) belong to the files a run
writes (docs/results/run.json, docs/results/report.md, a benchmark's JSON line); a page names the
file or key instead of copying the number, so a rerun cannot leave a page behind. The dated
notebooks (docs/lab-notes.md, docs/data-path-log.md) keep the figures of their day and are not
checked; docs/results/ is generated.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOTEBOOKS = {"lab-notes.md", "data-path-log.md"}
PAGES = [README] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in NOTEBOOKS)

# A number followed by what makes it a run's figure. Configured values (link rates in Mbit/s or
# Gbps, timeouts in seconds, chunk sizes) are settings, not run figures, and are not listed.
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
RUN_FIGURE = re.compile("|".join([
    rf"\b{_NUMBER}\s+(?:measured\s+)?(?:agree|differ|not testable)\b",   # verdict counts
    rf"\b{_NUMBER}\s*(?:minutes|min)\b",                                 # wall times
    rf"\b{_NUMBER}\s*s per (?:exchange|iteration)\b",                    # benchmark times
    rf"\b{_NUMBER}\s*ms (?:of CPU )?per exchange\b",
    rf"\b{_NUMBER}\s*(?:GB/s|Gbit/s)",                                   # measured throughput
    rf"\b{_NUMBER}\s*×\s*(?:the wire bound|its (?:wire |compute )?floor|phub's time)",
    rf"\b{_NUMBER}\s+(?:points|measurements|claim rows)\b",              # a run's counts
    rf"\b(?:ratio|wire_bound_ratio|gloo_over_phub|beyond_share)\W{{1,3}}{_NUMBER}",
]), re.IGNORECASE)
# A commit hash: 7 to 40 hex digits with at least one digit and one letter.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def run_figures(text: str):
    """(line number, figure) for every run figure written in `text`."""
    return [(number, match.group(0)) for number, line in enumerate(text.splitlines(), 1)
            for match in RUN_FIGURE.finditer(line)]


def test_the_checks_recognize_what_they_forbid():
    stale = ("`make paper` took 37.8 minutes; of its 132 claim rows, 21 measured agree, 58 measured differ.\n"
             "phub 0.142 s per exchange, 1.11 × the wire bound; raw TCP 31.0 Gbit/s; 143 points.\n"
             "`wire_bound_ratio` 1.13 and 18.9 GB/s\n")
    found = [figure for _, figure in run_figures(stale)]
    assert len(found) == 10, found
    assert run_figures("the job fails after `--timeout` seconds (default 300 s); links at 50 Mbit/s") == []
    assert COMMIT.findall("the run of fecb16d, not a word like deadbeefed or 20261207") == ["fecb16d"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_states_a_run_figure(page):
    found = run_figures(page.read_text())
    assert not found, (f"{page.relative_to(ROOT)} states run figures that a rerun would leave stale "
                       f"(name the file or JSON key that holds them instead): {found}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_names_a_commit(page):
    hashes = COMMIT.findall(page.read_text())
    assert not hashes, f"{page.relative_to(ROOT)} names commits {hashes}: the history goes in docs/lab-notes.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to files that do not exist: {broken}"


def test_the_readme_is_short_and_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; the reference goes under docs/"
    top = "\n".join(lines[:30])
    assert re.search(r"^make paper\b", top, re.M) and re.search(r"^make test\b", top, re.M), \
        "the README's first 30 lines must show `make paper` and `make test`"
    assert not re.search(r"\bissues?\s+#?\d+|#\d+\b", README.read_text(), re.I), "the README refers to issues"


def test_the_api_reference_builds_strictly(tmp_path):
    out = tmp_path / "api"
    build = subprocess.run([sys.executable, str(ROOT / "docs" / "build_api.py"), str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, build.stderr[-3000:]
    page = (out / "phub.html").read_text()
    for name in ("connect", "pushpull", "NAG", "JobFailed"):
        assert name in page, f"the API reference of phub lacks {name}"
    assert (out / "phub" / "integrations" / "torch.html").exists()


def test_a_module_that_does_not_import_fails_the_api_build(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import build_api
    finally:
        sys.path.pop(0)
    package = tmp_path / "brokenpkg"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package one of whose modules cannot be imported."""\n')
    (package / "bad.py").write_text('raise ImportError("no such dependency")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = build_api.build(tmp_path / "out", modules=["brokenpkg"])
    assert any("brokenpkg.bad" in problem and "no such dependency" in problem for problem in problems), problems
    assert not (tmp_path / "out").exists()


def test_the_readme_states_the_committed_ddp_benchmarks_ratios():
    # The one benchmark figure the README states (its PyTorch section), checked against the
    # committed output of the command it names, so that a rerun that changes them fails here.
    summary = json.loads((ROOT / "benchmarks" / "results" / "ddp_loop.json").read_text())["summary"]
    ratios = {shape: summary["shapes"][shape]["ratio_over_gloo"] for shape in ("mlp", "resnet")}
    text = " ".join(README.read_text().split())
    assert "python benchmarks/ddp_loop.py --out benchmarks/results/ddp_loop.json" in text
    assert (f"the hook at {ratios['mlp']['hook']:.2f}x Gloo's steps per second on a communication-heavy MLP "
            f"and {ratios['resnet']['hook']:.2f}x on a small ResNet, `ServerOptimizer` at "
            f"{ratios['mlp']['server']:.2f}x and {ratios['resnet']['server']:.2f}x") in text
