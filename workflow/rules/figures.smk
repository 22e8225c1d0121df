# Figures: ours and the paper's (analysis/reference) on the same axes, one PNG per paper figure.
# Each figure's caption in the Snakemake report is the one this run wrote beside the PNG: the
# static caption of analysis/captions/ plus the count of our points by what bounded them.
# (A caption path is taken relative to this file, so the run's caption is given absolute.)

for _figure in FIGURES:

    rule:
        name:
            f"figure_{_figure}"
        input:
            all_results(),
        output:
            png=report(
                RESULTS + f"/figures/{_figure}.png",
                caption=str(Path(RESULTS).absolute() / "figures" / f"{_figure}.rst"),
                category="Figures",
            ),
            caption=RESULTS + f"/figures/{_figure}.rst",
        log:
            RESULTS + f"/logs/figures/{_figure}.log",
        params:
            figure=_figure,
            results=RESULTS,
        shell:
            "{PYTHON} -m analysis figures --results {params.results}/points "
            "--out {params.results}/figures --only {params.figure} 2> {log}"
