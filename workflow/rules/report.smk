# Report: one row per paper claim (paper, ours, ratio, verdict, why).


rule report:
    input:
        all_results(),
        expand(RESULTS + "/figures/{figure}.png", figure=FIGURES),
    output:
        RESULTS + "/report.md",
    log:
        RESULTS + "/logs/report.log",
    shell:
        "{PYTHON} -m analysis report --results {RESULTS}/points --figures {RESULTS}/figures "
        "--out {output} 2> {log}"
