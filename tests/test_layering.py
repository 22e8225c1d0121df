"""The library and the harness are separate: phub imports nothing of the lab, and its wheel holds
phub alone (the harness, experiments/ and analysis/ at the top of the checkout, is a distribution
of its own that lab/pyproject.toml packages and that depends on phub)."""
import ast
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path

from phub.config import TRANSPORTS

ROOT = Path(__file__).resolve().parents[1]
LAB = {"experiments", "analysis", "workflow", "benchmarks", "tests"}


def _imported_top_levels(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def test_the_library_imports_nothing_of_the_harness():
    found = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for path in sorted((ROOT / "phub").rglob("*.py"))
             for line, name in _imported_top_levels(path) if name in LAB]
    assert found == []


def _shared_basenames(root: Path) -> dict:
    """Module basenames (without `__init__`) that more than one module under `root` has: name ->
    the modules' paths. A C source counts by the extension it builds (`_fastpath.c`: `_fastpath`)."""
    paths = {}
    for path in sorted(root.rglob("*.py")) + sorted(root.rglob("*.c")):
        if path.stem != "__init__" and "__pycache__" not in path.parts:
            paths.setdefault(path.stem, []).append(str(path.relative_to(root)))
    return {name: where for name, where in paths.items() if len(where) > 1}


def test_no_two_library_modules_share_a_name():
    """One name per concept: a reader who meets `core` or `worker` finds one module of that name."""
    assert _shared_basenames(ROOT / "phub") == {}


def test_the_basename_check_sees_a_shared_name(tmp_path):
    for path in ("a/worker.py", "b/worker.py", "b/__init__.py", "__init__.py", "c.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert _shared_basenames(tmp_path) == {"worker": ["a/worker.py", "b/worker.py"]}


def test_the_harness_sits_at_the_top_of_the_checkout():
    """The brief's layout: experiments/ and analysis/ beside phub/, installed from there."""
    import analysis
    import experiments
    assert {Path(module.__file__).resolve().parent for module in (experiments, analysis)} == \
        {ROOT / "experiments", ROOT / "analysis"}


def test_the_scan_sees_an_import_of_the_harness(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from experiments.runner import Options\nimport analysis.report\n")
    assert sorted(name for _, name in _imported_top_levels(sample)) == ["analysis", "experiments"]


def test_the_wheel_holds_the_library_only(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = tmp_path.glob("phub-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"phub", "phub-0.1.0.dist-info"}
    assert "phub/cli.py" in names and "phub/launching/selftest.py" in names
    assert not [name for name in names if "layouts" in name or "cluster/emulated" in name]


def _transport_tests(path: Path):
    """Where `path`'s code (not its comments or text) names a transport: a name with "verbs" in
    it, or a transport's name as a string ("tcp", "verbs", "soft-verbs")."""
    with tokenize.open(path) as f:
        for token in tokenize.generate_tokens(f.readline):
            if (token.type == tokenize.NAME and "verbs" in token.string) or \
                    (token.type == tokenize.STRING and token.string.strip("'\"") in TRANSPORTS):
                yield f"{path.name}:{token.start[0]} {token.string}"


def test_no_loop_or_protocol_module_branches_on_the_transport():
    """The I/O loops and the protocol call the data-path interface (phub/network/datapath.py); only the
    transports (phub/network/datapath.py, phub/network/rdma/) and the places that name them for a user (config,
    doctor, cli) say which one runs."""
    blind = [ROOT / "phub" / name for name in ("server/coreloop.py", "server/processes.py", "reduction/aggregation.py",
                                                "reduction/hierarchy.py")]
    blind += sorted((ROOT / "phub" / "client").glob("*.py"))
    blind += sorted((ROOT / "phub" / "protocol").glob("*.py"))
    assert [hit for path in blind for hit in _transport_tests(path)] == []


def test_the_transport_scan_sees_a_branch(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('# verbs in a comment is fine\nif transport != "tcp":\n    self._verbs = open_it()\n')
    assert [hit.split()[1] for hit in _transport_tests(sample)] == ['"tcp"', "_verbs"]
