# Figures: ours next to the paper's (analysis/reference), one PNG per paper figure, each with
# its own caption in the Snakemake report.

for _figure in FIGURES:

    rule:
        name:
            f"figure_{_figure}"
        input:
            all_results(),
        output:
            report(
                RESULTS + f"/figures/{_figure}.png",
                caption=f"../../analysis/captions/{_figure}.rst",
                category="Figures",
            ),
        log:
            RESULTS + f"/logs/figures/{_figure}.log",
        params:
            figure=_figure,
        shell:
            "{PYTHON} -m analysis figures --results {RESULTS}/points --out {RESULTS}/figures "
            "--only {params.figure} 2> {log}"
