"""The analysis: loading tidy results, every figure, the claims report and its verdicts.

The data here are synthetic and hand-made, so every derived number is known in advance. Most of
"ours" equals the paper, and a few rows are deliberately off (see `OFF`).
"""
from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import __main__ as cli
from analysis import claims as claims_mod
from analysis import cost, derive, figures, plotting, reference, report, results
from analysis.verdict import AGREE, DERIVED, DIFFER, NO_DATA, NOT_TESTABLE, PAPER_ONLY, Claim

REF = reference.load()
OFF = {("alexnet", "ib56g", "phub"): 2.0}  # ours = 2 x the paper's speedup here
CALIBRATION_RATE = 200_000.0  # chunks/s per server core
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(**values):
    row = {"experiment": "pbox", "point": "p0", "system": "phub", "model": "alexnet", "workers": 4,
           "racks": 1, "interfaces": 2, "cores": 2, "chunk_bytes": 32768, "oversubscription": 1,
           "network": "emulated", "setting": "", "link_gbps": 1.0, "link_gbps_measured": 0.97,
           "s_n": 10, "s_m": 8, "s_t": 0.8, "compute": "replay", "variant": "", "repeat": 0,
           "seconds_per_iteration": math.nan, "exchanges_per_s": math.nan, "samples_per_s": math.nan,
           "bytes_per_worker": 1e6, "verified": True, "git_commit": "abc1234", "host": "testhost",
           "bound": "wire", "cpu_busy": 0.4, "busiest_process": "phub-server", "busiest_process_cpu": 0.8,
           "link_utilization": 0.9, "chunk_bytes_paper": 32768 * 8, "chunks_per_worker": 100, "verify_kind": "oracle",
           "job": pd.NA, "chunks_per_s_per_core": math.nan, "gbit_per_s_per_core": math.nan}
    row.update(values)
    return row


def _repeats(value, **values):
    """Three repeats around `value`; their median is exactly `value`."""
    key = next(k for k in ("samples_per_s", "exchanges_per_s", "seconds_per_iteration") if k in values)
    return [_row(**{**values, key: value * f, "repeat": r}) for r, f in enumerate((0.98, 1.0, 1.03))]


def synthetic_runs() -> pd.DataFrame:
    rows = []
    paper = REF["speedup_end_to_end"].data
    for r in paper[paper["system"] == "PHub"].itertuples():
        same = paper[(paper["model"] == r.model) & (paper["network"] == r.network)].set_index("system")["speedup"]
        speed = {"phub": same["PHub"], "pshard": same["PShard"], "pslite-shard": 1.0, "pslite-central": 0.9,
                 "gloo-ring": 1.2}
        for system, s in speed.items():
            s *= OFF.get((r.model, r.network, system), 1.0)
            rows += _repeats(100 * s, experiment="pbox", model=r.model, setting=r.network, system=system,
                             samples_per_s=0, workers=8)
    for k in (1, 2):
        for w in (1, 2, 4, 8, 16):
            rows += _repeats(min(10.0 * w, 40.0 * k), experiment="capacity", model="resnet50", interfaces=k,
                             workers=w, exchanges_per_s=0, compute="zero")
    scale = REF["scaling_exchanges"].data
    for r in scale.itertuples():
        ours = reference.PAPER_TO_OURS[r.system]
        if ours:
            rows += _repeats(r.exchanges_per_s / 10, experiment="scaling", system=ours, workers=r.workers,
                             exchanges_per_s=0, compute="zero")
    for r in REF["cross_rack_overhead"].data.itertuples():  # the paper's method: one PBox simulating R racks
        rows += _repeats(1 + r.overhead_pct / 100, experiment="cross_rack", model=r.model, racks=1,
                         simulated_racks=r.racks, workers=8, seconds_per_iteration=0)
    for model in ("alexnet", "resnet50"):
        rows += _repeats(1.0, experiment="cross_rack", model=model, racks=1, simulated_racks=1, workers=8,
                         seconds_per_iteration=0)
    for ratio in (1, 2, 4, 8):
        for system, rate in (("phub", 100 / (1 + 0.05 * math.log2(ratio))), ("pshard", 80 / ratio ** 0.5),
                             ("gloo-ring", 70 / ratio ** 0.6)):
            rows += _repeats(rate, experiment="oversubscription", system=system, oversubscription=ratio,
                             racks=2, workers=8, samples_per_s=0)
    # breakdown: stock PS and PHub exactly as the paper's bars (aggregator+optimizer split evenly)
    for model, parts in (("alexnet", {"pslite-central": (0.56, 0.02, 0.005, 0.005), "phub": (0.075, 0.02, 0, 0)}),
                         ("resnet269", {"pslite-central": (1.57, 0.35, 0.34, 0.02), "phub": (0.45, 0.35, 0, 0)})):
        for system, (full, comp, agg, opt) in parts.items():
            for variant, t in (("full", full), ("no_compute", full - comp), ("no_aggregation", full - agg),
                               ("no_optimizer", full - opt)):
                rows += _repeats(t, experiment="breakdown", model=model, system=system, variant=variant,
                                 seconds_per_iteration=0)
    for r in REF["chunk_size_sweep"].data.itertuples():  # swept at 1/s_m of the paper's sizes
        rows += _repeats(r.samples_per_s / 10, experiment="chunk_sweep", chunk_bytes=r.chunk_bytes // 8,
                         chunk_bytes_paper=r.chunk_bytes, samples_per_s=0)
    for variant, seconds in (("alone", 1.0), ("shared", 2.0)):  # sharing costs exactly the share
        for job in (0, 1):
            rows += _repeats(seconds, experiment="multitenant", model="resnet50", variant=variant, job=job,
                             seconds_per_iteration=0)
    rows += [_row(experiment="calibration", point="cal", model="", network="loopback", compute="", repeat=r,
                  chunk_bytes=32768, cores=1, workers=4, chunks_per_s_per_core=CALIBRATION_RATE * f,
                  gbit_per_s_per_core=CALIBRATION_RATE * f * 32768 * 8 / 1e9, link_gbps=math.nan,
                  link_gbps_measured=math.nan, verify_kind="none", verified=pd.NA)
             for r, f in enumerate((0.98, 1.0, 1.03))]
    return pd.DataFrame(rows)


def synthetic_curves() -> pd.DataFrame:
    return pd.DataFrame([{"framework": f, "workers": n, "epoch": e, "train_loss": 2 * 0.7 ** e + 1e-3 * n}
                         for f in ("mxnet", "torch-ddp") for n in (1, 2, 4) for e in range(1, 6)])


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    """The synthetic data as the workflow would write it: one CSV per experiment, plus a curve."""
    directory = tmp_path_factory.mktemp("results")
    runs = synthetic_runs()
    runs["extra_column"] = "kept"
    for name, rows in runs.groupby("experiment"):
        (directory / name).mkdir()
        rows.to_csv(directory / name / "runs.csv", index=False)
    synthetic_curves().to_csv(directory / "convergence.csv", index=False)
    (directory / ".partial-xyz.csv").write_text("half a fi")  # a killed atomic write: skipped
    return directory


@pytest.fixture(scope="module")
def loaded(results_dir):
    return results.load(results_dir)


def by_claim(claims, text):
    found = [c for c in claims if c.claim == text]
    assert len(found) == 1, f"{len(found)} claims named {text!r}"
    return found[0]


def test_load_concatenates_and_types(loaded):
    runs = loaded.runs
    assert len(runs) == len(synthetic_runs())
    assert set(runs["experiment"]) == set(results.EXPERIMENTS) - {"convergence"}
    assert str(runs["workers"].dtype) == "Int64" and runs["verified"].all()
    assert (runs["extra_column"] == "kept").all()
    assert set(loaded.convergence["workers"]) == {1, 2, 4} and "loss" in loaded.convergence


@pytest.mark.parametrize("change, expected", [
    (lambda f: f.drop(columns=["s_n"]), "missing column(s) 's_n'"),
    (lambda f: f.assign(workers=["four"] + list(f["workers"][1:])), "column 'workers', line 2: 'four'"),
    (lambda f: f.assign(system="mxnet"), "column 'system', line 2: 'mxnet' is not one of"),
    (lambda f: f.assign(repeat=1.5), "'1.5' is not a whole number"),
    (lambda f: f[["system"]], "missing column 'experiment'"),
])
def test_malformed_file_names_file_and_column(tmp_path, change, expected):
    change(pd.DataFrame(synthetic_runs().head(3))).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(results.ResultsError) as info:
        results.load(tmp_path)
    assert "bad.csv" in str(info.value) and expected in str(info.value)


def test_a_bad_value_is_named_in_its_own_file_among_several(tmp_path):
    """Run files are converted together: the error still names the file and line of the value."""
    good = pd.DataFrame(synthetic_runs().head(3))
    good.to_csv(tmp_path / "a.csv", index=False)
    good.assign(repeat=["1", "2", "x"]).to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(results.ResultsError) as info:
        results.load(tmp_path)
    assert str(info.value).startswith(str(tmp_path / "b.csv")) and "column 'repeat', line 4: 'x'" in str(info.value)


def test_derived_numbers_match_the_hand_made_data(loaded):
    runs = loaded.runs
    speed = derive.median(derive.speedups(runs), ["model", "setting", "system"], "speedup")
    one = speed[(speed["model"] == "resnet18") & (speed["setting"] == "cloud10g") & (speed["system"] == "phub")]
    assert one["speedup"].iloc[0] == pytest.approx(3.9)
    assert derive.capacity_knee(derive.capacity(runs)) == (8, True, "resnet50")
    over = derive.cross_rack(runs)
    assert set(over["series"]) == {derive.SIMULATED}
    assert over[(over["model"] == "alexnet") & (over["racks"] == 8)]["overhead_pct"].median() == pytest.approx(16.5)
    assert derive.peak_chunk(derive.chunk_sweep(runs)) == 32768 // 8  # our own chunk bytes
    shape = derive.chunk_shape(runs)
    assert derive.peak_chunk(shape.assign(chunk_bytes=shape["chunk_bytes_paper"])) == 32768  # paper-equivalent
    assert derive.multitenant(runs)["beyond_share"].median() == pytest.approx(1.0)
    assert derive.capacity_flatness(derive.capacity(runs), 8) == pytest.approx(1.0)


def test_deployment_cost_by_hand():
    prices = cost.load_prices()
    # 8 workers x (gpu 700 + nic 250 + cable 40 + port 150); 2 PBoxes x (12000 + 2 x 440);
    # core 2:1: 2 racks x ceil(4 / 2) uplinks x (2 ports + cable) = 4 x 340
    assert cost.deployment_cost(prices, "pshard", 8, 2, 2, 2, 10) == 8 * 1140 + 4 * 340
    assert cost.deployment_cost(prices, "phub", 8, 2, 2, 2, 10) == 8 * 1140 + 2 * 12880 + 4 * 340
    assert cost.tier(prices, 1.0 * 10) == 10 and cost.tier(prices, 40) == 56


def test_bandwidth_per_ps_formulas():
    table = derive.bandwidth_per_ps(["alexnet"], {"alexnet": 0.02}).set_index("placement")["gbps"]
    m_gbit = 203376032 * 8 / 1e9  # AlexNet's bytes in phub's layout
    assert table["CC"] == pytest.approx(2 * m_gbit * 7 / 0.02)
    assert table["CS"] == pytest.approx(4 * m_gbit * 7 / (0.02 * 8))
    assert table["NCS"] == pytest.approx(2 * m_gbit / 0.02)
    default = derive.bandwidth_table(REF, ["resnet269"])
    assert set(default["compute_seconds"]) == {0.35} and set(default["t_source"]) == {"paper, chart-read"}


@pytest.fixture
def low_resolution(monkeypatch):
    """Figures at a lower resolution than the pipeline's: the same drawing code, a faster test."""
    monkeypatch.setattr(plotting, "DPI", 50)


def test_every_figure_renders(loaded, tmp_path, low_resolution):
    paths = figures.render_all(loaded, tmp_path, REF)
    assert set(paths) == set(figures.FIGURES)
    for name, path in paths.items():
        data = path.read_bytes()
        assert path.name == f"{name}.png" and data.startswith(PNG_MAGIC) and len(data) > 5_000, name
        assert figures.caption_path(name).read_text().strip(), f"caption of {name} is empty"
    assert not list(tmp_path.glob(".*")), "a temporary file was left behind"


def test_figures_without_data_say_so(tmp_path, monkeypatch, low_resolution):
    marked = []
    original = plotting.no_data
    for module in (figures.fig_pbox, figures.fig_rack, figures.fig_micro):
        monkeypatch.setattr(module, "no_data", lambda ax, text=plotting.NO_DATA: (marked.append(text),
                                                                                   original(ax, text)))
    empty = results.Results(results.empty_runs())
    paths = figures.render_all(empty, tmp_path, REF)
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in paths.values())
    # every figure but bandwidth_per_ps (computed, needs no run) marks at least one panel
    assert marked.count(plotting.NO_DATA) >= len(figures.FIGURES) - 1


def test_report_verdicts(loaded):
    claims = claims_mod.all_claims(loaded.runs, REF)
    assert by_claim(claims, "PHub, resnet18, cloud10g").verdict == AGREE  # ours = paper
    off = by_claim(claims, "PHub, alexnet, ib56g")
    assert off.verdict == DIFFER and off.ratio == pytest.approx(2.0) and off.reason  # ours = 2 x paper
    assert by_claim(claims, "PShard, alexnet, ib56g").verdict == AGREE
    best = by_claim(claims, "PHub up to 7.7x over stock MXNet (56 Gbps InfiniBand, best model: alexnet)")
    assert best.verdict == DIFFER and best.ours == pytest.approx(15.4)
    ib = by_claim(claims, "PHub up to 2.7x faster than MXNet over InfiniBand (AlexNet, 10 Gbps cloud)")
    assert ib.verdict == PAPER_ONLY and "RDMA" in ib.reason
    assert by_claim(claims, "Overhead of 8 racks vs one, alexnet").verdict == AGREE
    # the made-up repeats (2-3% around their median) could move ResNet-50's 1.9% either way
    assert by_claim(claims, "Overhead of 8 racks vs one, resnet50").verdict == NOT_TESTABLE
    assert by_claim(claims, "Training throughput peaks at 32 KB chunks").verdict == AGREE
    assert by_claim(claims, "alexnet: PHub's iteration time / the stock PS's").verdict == AGREE
    assert by_claim(claims, "resnet269: share of the stock PS's iteration not spent computing").verdict == AGREE
    assert by_claim(claims, "inception-v3: PHub's iteration time / the stock PS's").verdict == NO_DATA
    assert by_claim(claims, "Ranking at 8 workers").verdict == AGREE
    assert by_claim(claims, "PHub / PShard exchanges/s at 8 workers (ours: phub / pshard)").verdict == AGREE
    capacity = by_claim(claims, "One PBox serves ~120 ResNet-50 workers")
    assert capacity.verdict == DERIVED and "28 cores" in capacity.reason and "200,000 chunks/s" in capacity.reason
    # 28 x 200000 / (3219 x 2 / T) cores-limited ~ 129; the NICs cap it lower
    assert capacity.ours < 28 * CALIBRATION_RATE / (3219 * 2 / 0.2) and "NICs" in capacity.reason
    assert by_claim(claims, "A PBox is capped by PCIe-to-cache transfers: ~1500 M cache-line transfers/s, of "
                            "which PHub uses 95%").verdict == PAPER_ONLY


def test_empty_optional_values_do_not_break_the_analysis(loaded):
    """Columns that may be empty (racks, interfaces, link rate, ratio) are empty on some rows."""
    runs = loaded.runs.copy()
    holes = runs.index % 3 == 0
    for column in ("racks", "interfaces", "link_gbps", "oversubscription", "s_n", "chunk_bytes"):
        runs.loc[holes, column] = pd.NA
    claims = claims_mod.all_claims(runs, REF)
    assert len(claims) == len(claims_mod.all_claims(loaded.runs, REF))
    assert not derive.oversubscription(runs).empty and not derive.cross_rack(runs).empty


def test_report_without_runs_says_no_data():
    claims = claims_mod.all_claims(results.empty_runs(), REF)
    measured = [c for c in claims if c.kind != "paper_only" and c.basis == "measured"]
    assert measured and all(c.verdict == NO_DATA for c in measured)
    bandwidth = [c for c in claims if c.section.startswith("Bandwidth")]
    assert len(bandwidth) == 16 and all(c.verdict == DERIVED for c in bandwidth)
    assert not [p for c in claims for p in c.problems()]


def test_verdict_rule_edges():
    assert Claim("s", "c", 2.0, 2.5).verdict == AGREE  # 1.25
    assert Claim("s", "c", 2.0, 2.6).verdict == DIFFER
    assert Claim("s", "c", 0.4, 0.59, "percent").verdict == AGREE  # within 50% of the paper's value
    assert Claim("s", "c", 0.4, 0.0, "percent").verdict == DIFFER  # zero overhead is not 0.4%
    assert Claim("s", "c", 0.4, 2.9, "percent").verdict == DIFFER
    assert Claim("s", "c", 0.0, 0.4, "percent").verdict == AGREE  # paper 0: within 0.5 points
    assert Claim("s", "c", 1.36, 1.2, "at_least").verdict == AGREE and Claim("s", "c", 1.36, 1.0, "at_least").verdict == DIFFER
    assert Claim("s", "c", 14.3, 28.6, "percent").verdict == DIFFER
    assert Claim("s", "c", ["a", "b", "c"], ["a", "x", "c", "b"], "order").verdict == DIFFER
    assert Claim("s", "c", ["a", "b", "c"], ["a", "c"], "order").verdict == AGREE
    assert Claim("s", "c", 32.0, None, "exact").verdict == NO_DATA


def test_report_file(loaded, results_dir, tmp_path):
    out = tmp_path / "results" / "report.md"
    figures_dir = tmp_path / "results" / "figures"
    figures_dir.mkdir(parents=True)
    (figures_dir / "scaling.png").write_bytes(PNG_MAGIC)  # the report only links the files
    report.write(loaded, figures_dir, out, REF)
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.count("**") == 2]
    assert len(rows) == len(claims_mod.all_claims(loaded.runs, REF))
    assert "ours / paper ≤ 1.25" in text and "s_n = 10" in text and "testhost" in text
    assert "- [scaling](figures/scaling.png)" in text and "- cross_rack: missing" in text


def test_cli(results_dir, tmp_path, capsys):
    assert cli.main(["figures", "--results", str(results_dir), "--out", str(tmp_path), "--only", "cross_rack"]) == 0
    assert (tmp_path / "cross_rack.png").exists()
    assert cli.main(["report", "--results", str(results_dir), "--figures", str(tmp_path),
                     "--out", str(tmp_path / "report.md")]) == 0
    assert "| claim |" in (tmp_path / "report.md").read_text()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.csv").write_text("experiment,system\npbox,phub\n")
    assert cli.main(["report", "--results", str(bad), "--figures", str(tmp_path), "--out", str(tmp_path / "r.md")]) == 2
    assert "x.csv" in capsys.readouterr().err


def test_check_finds_every_missing_figure_and_report_row(loaded, results_dir, tmp_path):
    figures_dir, out = tmp_path / "figures", tmp_path / "report.md"
    figures_dir.mkdir()
    for name in figures.FIGURES:
        (figures_dir / f"{name}.png").write_bytes(PNG_MAGIC + bytes(2000))
    report.write(loaded, figures_dir, out, REF)
    assert report.check(loaded, figures_dir, out, REF) == []
    assert cli.main(["check", "--results", str(results_dir), "--figures", str(figures_dir), "--report", str(out)]) == 0

    (figures_dir / "scaling.png").unlink()
    (figures_dir / "breakdown.png").write_bytes(b"not a png" * 200)
    first_claim = claims_mod.all_claims(loaded.runs, REF)[0].claim
    out.write_text("\n".join(line for line in out.read_text().splitlines()
                             if not line.startswith(f"| {first_claim} |")))
    problems = report.check(loaded, figures_dir, out, REF, min_measured=10_000)
    assert any("scaling" in p and "missing" in p for p in problems)
    assert any("breakdown" in p and "not a PNG" in p for p in problems)
    assert any(first_claim in p for p in problems)
    assert any("claims have a measured value" in p for p in problems)
    assert cli.main(["check", "--results", str(results_dir), "--figures", str(figures_dir), "--report", str(out)]) == 1
