# Report: one row per paper claim (paper, ours, ratio, verdict, why), with the calibrated
# model's section (analysis.model, minutes of its own) made apart and included.


rule model:
    input:
        shapes=shape_outputs(),
        software_cost=results("shapes/software_cost.done"),
    output:
        results("model.md"),
    log:
        results("logs/model.log"),
    conda:
        ENV
    params:
        python=PYTHON,
        points=lambda wildcards, input: str(
            Path(input.software_cost).parent.parent / "points"
        ),
    shell:
        "{params.python} -m analysis.model --results {params.points} --out {output} 2> {log}"


rule report:
    input:
        shapes=shape_outputs(),
        curves=results(CURVES),
        figures=expand(results("figures/{figure}.png"), figure=FIGURES),
        model=results("model.md"),
    output:
        results("report.md"),
    log:
        results("logs/report.log"),
    conda:
        ENV
    params:
        python=PYTHON,
        points=lambda wildcards, input: points_folder(input),
        figures=lambda wildcards, input: str(Path(input.figures[0]).parent),
    shell:
        "{params.python} -m analysis report --results {params.points} "
        "--figures {params.figures} --model {input.model} --out {output} 2> {log}"
