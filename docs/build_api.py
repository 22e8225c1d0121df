"""Build phub's API reference (HTML) from its docstrings with pdoc, strictly.

    python docs/build_api.py [OUT_DIR]        (default build/api; `make api-docs`)

Documents the modules a user calls (the worker API, the launcher, hostfiles, the integrations).
Strict: a module that fails to import, or any warning pdoc raises (a docstring or annotation it
cannot render), fails the build with exit status 1, naming it; a missing pdoc exits 2 saying how to install it.
Writes into a temporary folder beside OUT_DIR and renames it into place, so OUT_DIR is either
the previous build or a whole new one.
"""
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

MODULES = ["phub", "phub.launching.launch", "phub.launching.hostfile", "phub.integrations.mxnet",
           "phub.integrations.torch"]


def build(out: Path, modules=MODULES) -> list:
    """Render `modules` into `out`; return what pdoc warned about or failed on, one line each
    (empty when clean: only then is `out` replaced)."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="markdown", search=False, show_source=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                pdoc.pdoc(*modules, output_directory=staging)
            except RuntimeError as error:  # pdoc's word for a module that does not import
                return [f"{error}: {error.__cause__!r}"]
        problems = [f"{Path(w.filename).name}:{w.lineno}: {w.category.__name__}: {w.message}"
                    for w in caught if "pdoc" in Path(w.filename).parts]
        if problems:
            return problems
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
        return []
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "build/api")
    try:
        import pdoc  # noqa: F401
    except ImportError:
        print("build_api: pdoc is not installed: pip install -e '.[test]' (or pip install pdoc)", file=sys.stderr)
        return 2
    problems = build(out)
    for problem in problems:
        print(f"build_api: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"build_api: {len(MODULES)} modules documented in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
