# Figures: ours and the paper's (analysis/reference) on the same axes, one PNG per paper figure.
# Each figure's caption in the Snakemake report is the one this run wrote beside the PNG: the
# static caption of analysis/captions/ plus the count of our points by what bounded them.
# (A caption path is taken relative to this file, so the run's caption is given absolute.)

for _figure in FIGURES:

    rule:
        name:
            f"figure_{_figure}"
        input:
            shapes=shape_outputs(),
            curves=results(CURVES),
        output:
            png=report(
                results(f"figures/{_figure}.png"),
                caption=str(Path(RESULTS).absolute() / "figures" / f"{_figure}.rst"),
                category="Figures",
            ),
            caption=results(f"figures/{_figure}.rst"),
        log:
            results(f"logs/figures/{_figure}.log"),
        conda:
            ENV
        params:
            python=PYTHON,
            figure=_figure,
            points=lambda wildcards, input: points_folder(input),
            figures=lambda wildcards, output: str(Path(output.png).parent),
        shell:
            "{params.python} -m analysis figures --results {params.points} "
            "--out {params.figures} --only {params.figure} 2> {log}"
