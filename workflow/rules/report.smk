# Report: one row per paper claim (paper, ours, ratio, verdict, why).


rule report:
    input:
        shapes=shape_outputs(),
        curves=results(CURVES),
        figures=expand(results("figures/{figure}.png"), figure=FIGURES),
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
        "--figures {params.figures} --out {output} 2> {log}"
