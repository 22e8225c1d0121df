# The software-cost experiment (experiments/softcost.py): every system on unshaped loopback,
# compute removed, full-size models; CPU seconds per exchange by role and by kind of code. One
# job for all of it (each `runs` entry is one command, which may name its own message settings);
# every (system, model, setting) is written to points/software_cost/ as soon as it is measured,
# so a rerun resumes. Its figure sits beside the paper's figures.


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
