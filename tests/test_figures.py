"""The figures' normalized values, the bounds of our points and the per-run captions.

Hand-made tidy rows with known numbers: the tests check the values that the figures plot (the
functions of analysis.normalize), not pixels, and that a figure renders to a real PNG with its
caption from an empty or partial results directory.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import figures, normalize, plotting, reference, results

REF = reference.load()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(**values):
    row = {"experiment": "scaling", "point": "", "system": "phub", "model": "alexnet", "workers": 1,
           "racks": 1, "interfaces": 2, "cores": 2, "chunk_bytes": 32768, "oversubscription": 1,
           "network": "emulated", "setting": "", "link_gbps": 1.0, "link_gbps_measured": 0.97,
           "s_n": 10, "s_m": 8, "s_t": 0.8, "compute": "zero", "variant": "", "repeat": 0,
           "seconds_per_iteration": math.nan, "exchanges_per_s": math.nan, "samples_per_s": math.nan,
           "bytes_per_worker": 1e6, "verified": True, "git_commit": "abc1234", "host": "testhost",
           "bound": "wire", "verify_kind": "oracle"}
    row.update(values)
    return row


def _frame(rows):
    return pd.DataFrame(rows)


@pytest.fixture
def low_resolution(monkeypatch):
    monkeypatch.setattr(plotting, "DPI", 40)


def test_speedup_is_over_the_stock_baseline_and_takes_the_worse_bound():
    rows = [_row(experiment="pbox", setting="cloud10g", system="pslite-shard", samples_per_s=100.0, workers=8,
                 repeat=r, bound="cpu" if r == 0 else "wire") for r in range(3)]
    rows += [_row(experiment="pbox", setting="cloud10g", system="phub", samples_per_s=s, workers=8, repeat=r)
             for r, s in enumerate((320.0, 330.0, 345.0))]
    # a smaller worker count is left out: only the largest per model and setting is shown
    rows += [_row(experiment="pbox", setting="cloud10g", system=s, samples_per_s=50.0, workers=4)
             for s in ("phub", "pslite-shard")]
    values = normalize.speedup(_frame(rows))
    assert set(values["workers"]) == {8}
    summary = normalize.summarize(values, ["model", "setting", "system"], "speedup").iloc[0]
    assert summary["median"] == pytest.approx(3.3)
    assert summary["q25"] == pytest.approx(3.25) and summary["q75"] == pytest.approx(3.375)
    # one of the baseline's three repeats was CPU-bound: the baseline point is, and so is every
    # ratio over it, although the numerator's runs were all wire-bound
    assert summary["bound"] == "cpu"


def test_scaling_efficiency_and_ratio_over_phub():
    rates = {"phub": {1: 10.0, 2: 20.0, 4: 36.0}, "pshard": {1: 10.0, 2: 15.0, 4: 20.0},
             "gloo-ring": {1: 99.0, 2: 8.0, 4: 12.0}}
    rows = [_row(system=s, workers=n, exchanges_per_s=x) for s, by_n in rates.items() for n, x in by_n.items()]
    values = normalize.scaling(_frame(rows)).set_index(["system", "workers"])
    assert (("gloo-ring", 1)) not in values.index  # a one-rank ring exchanges nothing
    assert values.loc[("phub", 4), "efficiency"] == pytest.approx(0.9)  # (36 / 4) / (10 / 1)
    assert values.loc[("pshard", 2), "efficiency"] == pytest.approx(0.75)
    assert values.loc[("gloo-ring", 4), "efficiency"] == pytest.approx(0.75)  # relative to its 2 workers
    assert values.loc[("pshard", 4), "over_phub"] == pytest.approx(20 / 36)
    assert values.loc[("phub", 2), "over_phub"] == pytest.approx(1.0)


def test_scaling_ratio_carries_phubs_bound():
    rows = [_row(system="phub", workers=1, exchanges_per_s=10.0),
            _row(system="phub", workers=2, exchanges_per_s=18.0, bound="cpu"),
            _row(system="pshard", workers=1, exchanges_per_s=8.0),
            _row(system="pshard", workers=2, exchanges_per_s=9.0)]
    values = normalize.scaling(_frame(rows)).set_index(["system", "workers"])
    assert values.loc[("pshard", 2), "bound"] == "wire"
    assert values.loc[("pshard", 2), "over_phub_bound"] == "cpu"


def test_paper_values_on_the_same_scales():
    paper = normalize.paper_scaling(REF).set_index(["system", "workers"])
    assert paper.loc[("phub", 8), "efficiency"] == pytest.approx((788 / 8) / 107)
    assert paper.loc[("pshard", 1), "over_phub"] == pytest.approx(69 / 107)
    assert "PSLite-IB-Shard" in paper.index.get_level_values("system")  # paper-only systems stay
    ratio = normalize.paper_breakdown(REF).set_index("model")["ratio"]
    data = REF["breakdown_mxnet_ps"].data
    alexnet = data[data["model"] == "alexnet"].groupby("phase")["seconds"].sum()
    assert ratio["alexnet"] == pytest.approx(alexnet["after"] / alexnet["before"])
    assert ratio["resnet269"] == pytest.approx(0.45 / 1.57)  # the paper's "resnet"
    share = normalize.paper_capacity(REF)
    assert share.loc[share["series"] == "microbenchmark", "share"].iloc[0] == pytest.approx(1370 / 1500)
    dollars = normalize.paper_per_dollar(REF).set_index("system")["relative"]
    assert dollars["phub"] == pytest.approx(82.2 / 60.4) and dollars["pshard"] == 1.0


def test_cross_rack_overhead_in_percent():
    rows = [_row(experiment="cross_rack", racks=1, seconds_per_iteration=2.0, workers=2)]
    rows += [_row(experiment="cross_rack", racks=4, seconds_per_iteration=t, workers=8, repeat=r)
             for r, t in enumerate((2.2, 2.3, 2.4))]
    rows.append(_row(experiment="cross_rack", system="pshard", racks=4, seconds_per_iteration=9.0))
    values = normalize.cross_rack(_frame(rows))
    assert list(values["racks"]) == [4, 4, 4]
    assert values["overhead_pct"].median() == pytest.approx(15.0)


def test_oversubscription_relative_to_one_to_one():
    rows = [_row(experiment="oversubscription", system=s, oversubscription=o, samples_per_s=x, racks=2, workers=8)
            for s, by_o in {"phub": {1: 100.0, 2: 90.0, 4: 80.0}, "pshard": {1: 80.0, 2: 40.0}}.items()
            for o, x in by_o.items()]
    values = normalize.oversubscription(_frame(rows)).set_index(["system", "oversubscription"])["relative_to_1"]
    assert values[("phub", 4)] == pytest.approx(0.8)
    assert values[("pshard", 2)] == pytest.approx(0.5)
    assert values[("phub", 1)] == pytest.approx(1.0)


def test_breakdown_ratio_over_the_stock_ps():
    rows = [_row(experiment="breakdown", system=s, model=m, variant="full", seconds_per_iteration=t)
            for s, m, t in (("pslite-central", "alexnet", 2.0), ("pslite-shard", "alexnet", 4.0),
                            ("phub", "alexnet", 0.5), ("pslite-shard", "resnet269", 1.0),
                            ("phub", "resnet269", 0.8))]
    rows.append(_row(experiment="breakdown", system="phub", model="alexnet", variant="no_compute",
                     seconds_per_iteration=0.1))
    values = normalize.breakdown(_frame(rows)).set_index("model")
    assert values.loc["alexnet", "ratio"] == pytest.approx(0.25)  # over central, when it was run
    assert values.loc["alexnet", "stock"] == "pslite-central"
    assert values.loc["resnet269", "ratio"] == pytest.approx(0.8)  # else over the sharded one


def test_chunk_sweep_by_paper_equivalent_bytes():
    rows = [_row(experiment="chunk_sweep", chunk_bytes=c, s_m=8, samples_per_s=x)
            for c, x in ((512, 40.0), (4096, 80.0), (32768, 60.0))]
    frame = _frame(rows)
    values = normalize.chunk_sweep(frame).set_index("chunk_bytes")
    assert values.loc[4096, "chunk_bytes_paper"] == 32768  # chunk bytes x s_m
    assert values.loc[4096, "normalized"] == pytest.approx(1.0)
    assert values.loc[512, "normalized"] == pytest.approx(0.5)
    # a recorded paper-equivalent size wins (extra columns arrive as text; an empty one falls back)
    frame["chunk_bytes_paper"] = ["8192", "", "131072"]
    values = normalize.chunk_sweep(frame).set_index("chunk_bytes")["chunk_bytes_paper"]
    assert list(values) == [8192, 32768, 131072]


def test_failed_oracle_rows_are_left_out_and_bounds_read_loosely():
    rows = [_row(exchanges_per_s=10.0, bound=" CPU "), _row(exchanges_per_s=11.0, repeat=1, verified=False),
            _row(exchanges_per_s=12.0, repeat=2, verified=False, verify_kind="digest"),
            _row(exchanges_per_s=13.0, repeat=3, bound=float("nan")), _row(exchanges_per_s=14.0, repeat=4, bound="?")]
    kept = normalize.usable(_frame(rows))
    assert list(kept["repeat"]) == [0, 2, 3, 4]
    assert list(kept["bound"]) == ["cpu", "wire", "", ""]
    old = _frame(rows).drop(columns=["bound", "verify_kind"])  # an old file: no bound, no verify kind
    assert set(normalize.usable(old)["bound"]) == {""} and len(normalize.usable(old)) == 5


def test_bound_of_a_point_over_its_repeats():
    assert normalize.worst(["wire", "wire"]) == "wire"
    assert normalize.worst(["wire", "cpu"]) == "cpu" and normalize.worst(["", "cpu"]) == "cpu"
    assert normalize.worst(["compute", "wire"]) == "wire" and normalize.worst(["wire", "other"]) == "other"
    assert normalize.worst(["", ""]) == "" and normalize.worst(["mixed"]) == ""  # a word no longer used


def test_bound_sentence_counts_and_names_the_cpu_bound_points():
    points = pd.DataFrame({"label": ["scaling/phub-n1", "scaling/phub-n2", "scaling/phub-n8", "scaling/pshard-n8"],
                           "bound": ["wire", "compute", "other", "cpu"]})
    text = normalize.bound_sentence(points)
    assert text == ("Our 4 points: 1 compute-bound, 1 wire-bound, 1 CPU-bound (scaling/pshard-n8), "
                    "1 bound by neither (other).")
    assert normalize.bound_sentence(points.iloc[:0]) == "Our points: none in this run."
    unknown = normalize.bound_sentence(pd.DataFrame({"label": ["a/b"], "bound": [""]}))
    assert unknown == "Our 1 point: 1 without a recorded bound."


def test_point_ids_are_made_up_where_old_files_share_one():
    rows = [_row(point="p0", workers=n, exchanges_per_s=1.0) for n in (1, 2)]
    rows.append(_row(point="phub-n4", workers=4, exchanges_per_s=1.0))
    labels = list(normalize.usable(_frame(rows))["label"])
    assert labels == ["scaling/phub-n1", "scaling/phub-n2", "scaling/phub-n4"]


def _write(directory, rows):
    directory.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(directory / "runs.csv", index=False)
    return results.load(directory)


def test_caption_counts_a_cpu_bound_point(tmp_path, low_resolution):
    rows = [_row(point=f"phub-n{n}", workers=n, exchanges_per_s=10.0 * n, bound="cpu" if n == 8 else "wire")
            for n in (1, 2, 4, 8)]
    # an older file's word for cores 60-85% busy, read as "other" (nothing ran full)
    rows.append(_row(point="pshard-n8", system="pshard", workers=8, exchanges_per_s=30.0, bound="mixed"))
    loaded = _write(tmp_path / "points", rows)
    png = figures.render("scaling", loaded, tmp_path / "figures", REF)
    assert png.read_bytes().startswith(PNG_MAGIC)
    text = (tmp_path / "figures" / "scaling.rst").read_text()
    assert text.startswith(figures.caption("scaling").rstrip())
    assert text.rstrip().endswith("Our 5 points: 3 wire-bound, 1 CPU-bound (scaling/phub-n8), "
                                  "1 bound by neither (other).")


@pytest.mark.parametrize("name", list(figures.FIGURES))
def test_every_figure_renders_from_an_empty_results_dir(tmp_path, name, low_resolution):
    (tmp_path / "points").mkdir()
    loaded = results.load(tmp_path / "points")
    png = figures.render(name, loaded, tmp_path / "figures", REF)
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    caption = (tmp_path / "figures" / f"{name}.rst").read_text()
    assert "*This run:*" in caption
    if name in normalize.FIGURE_ROWS:
        assert "Our points: none in this run." in caption
    assert not list((tmp_path / "figures").glob(".*"))  # no temporary file left behind


def test_figures_from_a_partial_results_dir(tmp_path, low_resolution):
    """Only one experiment measured, with an old file's columns (no bound): every figure draws."""
    rows = [_row(experiment="cross_rack", racks=r, workers=2 * r, seconds_per_iteration=1.0 + 0.01 * r)
            for r in (1, 2, 4)]
    frame = pd.DataFrame(rows).drop(columns=["bound", "verify_kind"])
    (tmp_path / "points").mkdir()
    frame.to_csv(tmp_path / "points" / "runs.csv", index=False)
    loaded = results.load(tmp_path / "points")
    paths = figures.render_all(loaded, tmp_path / "figures", REF)
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in paths.values())
    text = (tmp_path / "figures" / "cross_rack.rst").read_text()
    assert "Our 3 points: 3 without a recorded bound." in text
