"""The tests are sorted by what they need (tests/conftest.py): the rule on sample modules, and
the library's tests collected with the harness hidden, as on a machine with only phub installed."""
import subprocess
import sys
from pathlib import Path

from conftest import needs_of

ROOT = Path(__file__).resolve().parents[1]
HIDE_HARNESS = '''
import sys
class HideHarness:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("experiments", "analysis"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden)")
        return None
sys.meta_path.insert(0, HideHarness())
'''


def test_a_module_is_sorted_by_what_its_code_does():
    assert needs_of("import numpy\n\ndef test_x():\n    assert 1\n") == {"library"}
    assert needs_of("from experiments.runner import Options\n") == {"lab"}
    assert needs_of("def test_x():\n    from analysis import report\n") == {"lab"}
    assert needs_of("import subprocess\nsubprocess.run(['python', '-m', 'experiments', 'rack', 'up'])\n") == \
        {"lab", "jobs"}
    assert needs_of("import os\nROOT_ONLY = os.geteuid() == 0\n") == {"netns"}
    assert needs_of("import phub\nserver = phub.Server(config)\n") == {"jobs"}
    # a word in a comment or a docstring about the harness does not make a module need it
    assert needs_of('"""Unlike python -m experiments ..."""\n# snakemake\n') == {"lab"}  # a string: counted
    assert needs_of("# python -m experiments, in a comment only\nimport numpy\n") == {"library"}


def test_the_library_tests_are_collected_without_the_harness(tmp_path):
    (tmp_path / "hide_harness.py").write_text(HIDE_HARNESS)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "hide_harness", "--collect-only", "-q", "-m", "not lab",
                          "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "error" not in run.stdout.lower().split("tests collected")[-1]
    assert "test_analysis.py" not in run.stdout and "test_wire.py::" in run.stdout
