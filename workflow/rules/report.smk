# Report: one row per paper claim (paper, ours, ratio, verdict, why).


rule report:
    input:
        results=RESULTS + "/results.csv",
        figures=expand(RESULTS + "/figures/{figure}.png", figure=FIGURES),
    output:
        RESULTS + "/report.md",
    log:
        RESULTS + "/logs/report.log",
    shell:
        "{PYTHON} -m analysis report --results {input.results} --figures {RESULTS}/figures "
        "--out {output} 2> {log}"
