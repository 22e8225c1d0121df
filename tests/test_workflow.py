"""The pipeline's configuration and plan: schema validation, the experiment grid, a dry run."""
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
import points  # noqa: E402

CONFIGS = ["config/config.yaml", "config/quick.yaml"]
SCHEMA = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
EXPERIMENTS = {"pbox", "capacity", "scaling", "cross_rack", "oversubscription", "breakdown", "chunk_sweep",
               "multitenant", "calibration"}


def load(name):
    return yaml.safe_load((ROOT / name).read_text())


@pytest.mark.parametrize("name", CONFIGS)
def test_configs_validate_and_cover_every_experiment(name):
    config = load(name)
    jsonschema.validate(config, SCHEMA)
    grid = points.points(config)
    assert {p["experiment"] for p in grid} == EXPERIMENTS
    keys = [f"{p['experiment']}/{p['id']}" for p in grid]
    assert len(keys) == len(set(keys)), "point ids must be unique"
    for p in grid:
        if p["experiment"] == "calibration":  # unshaped, on loopback: what limits a server core
            assert p["network"] == "loopback" and "rack" not in p
            continue
        assert p["workers"] == p["rack"]["racks"] * p["rack"]["workers_per_rack"], p["id"]


@pytest.mark.parametrize("name", CONFIGS)
def test_every_host_link_runs_at_the_cap_and_runs_take_time_stretch_times_the_papers(name):
    config = load(name)
    for p in points.points(config):
        if "rack" not in p or p["experiment"] == "chunk_sweep":
            continue
        stretch = config["rack"]["time_stretch"]
        if p["experiment"] == "cross_rack" and "simulated_racks" not in p:  # the wire series may set its own
            stretch = config["experiments"]["cross_rack"].get("time_stretch", stretch)
        scale = p["rack"]["scale"]
        assert p["rack"]["link_gbps"] * 1000 / scale["network"] == pytest.approx(config["rack"]["max_link_mbit"])
        assert scale["network"] / scale["model"] == pytest.approx(stretch), p["id"]
        assert p["chunk_bytes_paper"] == round(p["chunk_bytes"] * scale["model"])


def test_the_chunk_sweep_runs_paper_equivalent_sizes_without_duplicates():
    config = load("config/config.yaml")
    sweep = [p for p in points.points(config) if p["experiment"] == "chunk_sweep"]
    wanted = [kb * 1024 for kb in config["experiments"]["chunk_sweep"]["chunk_kb"]]
    assert [p["chunk_bytes_paper"] for p in sweep] == pytest.approx(wanted, rel=0.01)
    assert len({p["chunk_bytes"] for p in sweep}) == len(sweep)
    assert all(p["chunk_bytes"] % 4 == 0 for p in sweep)


@pytest.mark.parametrize("paper_bytes", [32768, 65536])
def test_chunks_sized_by_their_paper_equivalent_move_a_model_in_about_the_papers_chunk_count(paper_bytes):
    """With rack.chunk_bytes_paper, real chunks are it / s_m, so each worker's share of a scaled
    model travels in the chunks the paper's full model would at that size (32 KB: the paper's
    count; 64 KB: within 2x of it), unless that chunk would be under rack.min_chunk_bytes."""
    from tidy import chunks_per_worker

    config = load("config/config.yaml")
    config["rack"].update(chunk_bytes_paper=paper_bytes, min_chunk_bytes=64)
    jsonschema.validate(config, SCHEMA)
    for p in points.points(config):
        if "rack" not in p or p["experiment"] == "chunk_sweep":
            continue
        s_m = p["rack"]["scale"]["model"]
        assert paper_bytes - 4 * s_m <= p["chunk_bytes_paper"] <= paper_bytes, p["id"]  # whole elements
        ours = chunks_per_worker(p["model"], dict(p["rack"]["scale"], time=1), p["chunk_bytes"])
        papers = chunks_per_worker(p["model"], None, points.PAPER_CHUNK_BYTES)
        assert papers * 32768 / paper_bytes <= ours <= papers * 2, (p["id"], ours, papers)


def test_the_grid_moves_the_papers_chunk_count_where_chunks_stay_above_their_floor():
    """The full grid sizes chunks at the paper's 32 KB / s_m: 488 B at 10 Gbps (the paper's
    count); at 56 Gbps that would be 84 B, so the floor (480 B) sets them and the point records
    the coarser paper-equivalent chunk it then is."""
    config = load("config/config.yaml")
    floor = config["rack"]["min_chunk_bytes"]
    seen = set()
    for p in points.points(config):
        if "rack" not in p or p["experiment"] == "chunk_sweep":
            continue
        s_m = p["rack"]["scale"]["model"]
        wanted = max(points.scaled_chunk(points.PAPER_CHUNK_BYTES, s_m), floor)
        assert p["chunk_bytes"] == wanted and p["chunk_bytes"] % 4 == 0, p["id"]
        assert p["chunk_bytes_paper"] == round(wanted * s_m), p["id"]
        seen.add((p["rack"]["link_gbps"], p["chunk_bytes"]))
    assert seen == {(10, 488), (10, 980), (56, floor)}  # 980 B: the racks on the wire, at time_stretch 6
    config["rack"]["min_chunk_bytes"] = 64
    at_56 = {p["chunk_bytes"] for p in points.points(config) if p.get("setting") == "ib56g"}
    assert at_56 == {84}  # 32 KB / 373.3 = 87.8 B, in whole float32 elements


def test_a_chunk_floor_without_paper_sized_chunks_is_refused():
    config = load("config/quick.yaml")
    del config["rack"]["chunk_bytes_paper"]
    config["rack"].update(chunk_bytes=8192, min_chunk_bytes=480)
    with pytest.raises(jsonschema.ValidationError, match="chunk_bytes_paper"):
        jsonschema.validate(config, SCHEMA)


def test_chunks_are_sized_one_way_at_a_time():
    config = load("config/quick.yaml")
    config["rack"]["chunk_bytes"] = 8192
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, SCHEMA)
    del config["rack"]["chunk_bytes_paper"]
    jsonschema.validate(config, SCHEMA)
    del config["rack"]["chunk_bytes"]
    assert {p["chunk_bytes"] for p in points.points(config)
            if "rack" in p and p["experiment"] != "chunk_sweep"} == {points.DEFAULT_CHUNK_BYTES}


def test_points_sharing_a_rack_form_one_shape_and_equal_measurements_are_taken_once():
    config = load("config/config.yaml")
    shapes = points.shapes(config)
    for members in shapes.values():
        assert len({str(p.get("rack")) for p in members}) == 1
    grid = points.points(config)
    by_key = {f"{p['experiment']}/{p['id']}": p for p in grid}
    # the breakdown's full variant is the pbox point of the same model, system and setting
    assert by_key["breakdown/alexnet-phub-full"]["measurement"] == by_key["pbox/ib56g-alexnet-phub"]["measurement"]
    assert by_key["breakdown/alexnet-phub-full"]["shape"] == by_key["pbox/ib56g-alexnet-phub"]["shape"]
    assert by_key["breakdown/alexnet-phub-no_compute"]["measurement"] != by_key["pbox/ib56g-alexnet-phub"]["measurement"]
    # capacity with the scaling experiment's interfaces is the scaling series of phub
    assert by_key["capacity/k8-n4"]["measurement"] == by_key["scaling/phub-n4"]["measurement"]


def test_the_grid_follows_the_config():
    config = load("config/quick.yaml")
    config["experiments"] = {"scaling": {"model": "resnet50", "workers": [1, 3], "systems": ["phub", "gloo-ring"],
                                         "interfaces": 2, "link_gbps": 10}}
    grid = points.points(config)
    # gloo-ring over one worker would allreduce nothing: the grid leaves it out
    assert [(p["system"], p["workers"]) for p in grid] == [("phub", 1), ("phub", 3), ("gloo-ring", 3)]
    assert all(p["compute"] == "zero" for p in grid)  # scaling removes compute, as the paper did


def _dry_run(tmp_path, config):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path),
                           "--config", f"results_dir={tmp_path / 'results'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_bad_value_stops_the_run_before_anything_starts_and_names_the_key(tmp_path):
    config = load("config/quick.yaml")
    config["experiments"]["scaling"]["systems"] = ["phub", "nccl"]
    run = _dry_run(tmp_path, config)
    assert run.returncode != 0
    assert "nccl" in run.stdout + run.stderr and "systems" in run.stdout + run.stderr
    assert not (tmp_path / "results").exists()


def test_dry_run_plans_every_point_figure_and_the_report(tmp_path):
    config = load("config/quick.yaml")
    run = _dry_run(tmp_path, config)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    planned = out.count("rule run_shape:")
    assert planned == len(points.shapes(config))
    for rule in ("provision", "build", "convergence", "report", "figure_scaling", "figure_cross_rack"):
        assert f"rule {rule}:" in out, rule


def test_network_hostfile_needs_a_hostfile_and_passes_it_to_every_point():
    import run_shape

    config = dict(load("config/quick.yaml"), network="hostfile")
    with pytest.raises(jsonschema.ValidationError, match="hostfile"):
        jsonschema.validate(config, SCHEMA)
    config["hostfile"] = "hosts.yaml"
    jsonschema.validate(config, SCHEMA)
    grid = points.points(config)
    phub_point = next(p for p in grid if p["system"] == "phub" and p["experiment"] == "cross_rack" and p["racks"] == 2)
    options = run_shape.options_for(phub_point)
    assert (options.network, options.spec, options.racks) == ("hostfile", "hosts.yaml", 2)
    assert "rack" not in phub_point  # real machines: nothing is shaped or scaled
    gloo = run_shape.options_for(next(p for p in grid if p["system"] == "gloo-ring"))
    assert (gloo.network, gloo.spec) == ("hostfile", "hosts.yaml")


def test_the_workflow_passes_snakemakes_lint_and_snakefmt():
    """Snakemake's own conventions: params for non-file values, a log and a conda environment on
    every rule, no paths composed with +; and snakefmt's formatting."""
    lint = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert lint.returncode == 0, lint.stdout[-3000:] + lint.stderr[-3000:]
    fmt = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "."], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert fmt.returncode == 0, fmt.stdout[-3000:] + fmt.stderr[-3000:]


def test_the_papers_rack_simulation_is_its_own_series_whose_one_rack_is_the_pbox_point():
    import run_shape

    grid = points.by_key(load("config/config.yaml"))
    sims = {k: p for k, p in grid.items() if k.startswith("cross_rack/sim-")}
    assert {p["simulated_racks"] for p in sims.values()} == set(range(1, 9))
    one, eight = grid["cross_rack/sim-alexnet-r1"], grid["cross_rack/sim-alexnet-r8"]
    assert one["measurement"] == grid["pbox/ib56g-alexnet-phub"]["measurement"]  # measured once
    assert eight["verify"] is False and one["verify"] is True  # R sums of the rack cannot meet the oracle
    assert eight["racks"] == 1 and eight["shape"] == one["shape"]  # one PBox, in the pbox points' rack
    assert len({p["measurement"] for p in sims.values()}) == len(sims)
    assert run_shape.options_for(eight).simulated_racks == 8 and run_shape.options_for(one).simulated_racks == 1
    # the points without a simulation keep the measurement digests they had before the series existed
    wire = grid["cross_rack/alexnet-r2"]
    assert "simulated_racks" not in wire and run_shape.options_for(wire).simulated_racks == 1


def test_the_racks_on_the_wire_may_stretch_their_time_and_nothing_else_does():
    config = load("config/config.yaml")
    config["experiments"]["cross_rack"].pop("time_stretch", None)
    base = points.by_key(config)
    config["experiments"]["cross_rack"]["time_stretch"] = 2 * config["rack"]["time_stretch"]
    jsonschema.validate(config, yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text()))
    stretched = points.by_key(config)
    wire, before = stretched["cross_rack/resnet50-r6"], base["cross_rack/resnet50-r6"]
    assert wire["rack"]["scale"]["model"] == pytest.approx(before["rack"]["scale"]["model"] / 2)
    assert wire["rack"]["scale"]["network"] == before["rack"]["scale"]["network"]
    assert wire["chunk_bytes"] == pytest.approx(2 * before["chunk_bytes"], rel=0.01)
    changed = {k for k in base if base[k]["measurement"] != stretched[k]["measurement"]}
    assert changed == {k for k in base if k.startswith("cross_rack/") and "/sim-" not in k}

