# The software-cost experiment (lab/experiments/softcost.py): every system on unshaped loopback,
# compute removed, full-size models; CPU seconds per exchange by role and by kind of code. One
# job for all of it (each `runs` entry is one command, which may name its own message settings);
# every (system, model, setting) is written to points/software_cost/ as soon as it is measured,
# so a rerun resumes. Its figure sits beside the paper's figures.


def software_cost_commands(wildcards, output):
    """One `bench software-cost` command per entry of the experiment's `runs`, joined by
    && (`true` where the config has none or disables it: the figure then says so)."""
    exp = config["experiments"].get("software_cost")
    if not exp or not exp.get("enabled", True):
        return "true"
    out = str(Path(output.done).parent.parent / "points" / "software_cost")
    common = f"--out {out} --workers {exp['workers']} --repeats {exp['repeats']} --block-mb {exp['block_mb']}"
    return " && ".join(
        f"{PYTHON} -m experiments bench software-cost {common} "
        f"--systems {' '.join(run['systems'])} --models {' '.join(run['models'])} "
        f"--chunk-kb {' '.join(map(str, run.get('chunk_kb', exp['chunk_kb'])))} "
        f"--bigarray-bound {' '.join(map(str, run.get('bigarray_bound', exp['bigarray_bound'])))}"
        for run in exp["runs"]
    )


rule software_cost:
    input:
        results("build/selftest.json"),
    output:
        done=results("shapes/software_cost.done"),
    log:
        results("logs/software_cost.log"),
    conda:
        ENV
    resources:
        # CPU seconds are what it measures: alone on the machine's cores, like every point.
        bench=1,
    params:
        commands=software_cost_commands,
    shell:
        "({params.commands}) > {log} 2>&1 && touch {output.done}"


rule figure_software_cost:
    input:
        done=results("shapes/software_cost.done"),
    output:
        png=report(
            results("figures/software_cost.png"),
            caption=str(Path(RESULTS).absolute() / "figures" / "software_cost.rst"),
            category="Figures",
        ),
        caption=results("figures/software_cost.rst"),
    log:
        results("logs/figures/software_cost.log"),
    conda:
        ENV
    params:
        python=PYTHON,
        points=lambda wildcards, input: str(Path(input.done).parent.parent / "points"),
        figures=lambda wildcards, output: str(Path(output.png).parent),
    shell:
        "{params.python} -m analysis figures --results {params.points} "
        "--out {params.figures} --only software_cost 2> {log}"
