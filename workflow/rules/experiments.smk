# Experiments: one tidy CSV per point, written atomically by run_point.py; finished points are
# skipped on a rerun because their CSV exists.

# Two JSON writes: not worth a cluster job each (no effect on a local run).
localrules:
    point_list,
    point_spec,


rule point_list:
    output:
        RESULTS + "/points/all.json",
    run:
        Path(output[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(output[0]).write_text(json.dumps(point_outputs()))


rule point_spec:
    output:
        RESULTS + "/points/{experiment}/{point}.json",
    run:
        Path(output[0]).write_text(json.dumps(POINTS[f"{wildcards.experiment}/{wildcards.point}"]))


rule run_point:
    input:
        selftest=RESULTS + "/build/selftest.json",
        point=RESULTS + "/points/{experiment}/{point}.json",
        progress=RESULTS + "/points/all.json",
    output:
        RESULTS + "/points/{experiment}/{point}.csv",
    log:
        RESULTS + "/logs/points/{experiment}/{point}.log",
    resources:
        # Points share the machine's cores and the emulated links: one at a time locally.
        bench=1,
    # A busy machine can make a rack's preflight miss its rates; one more try, then give up.
    retries: 1
    shell:
        "{PYTHON} workflow/scripts/run_point.py --point {input.point} --out {output} "
        "--progress {input.progress} 2>&1 | tee {log}; test ${{PIPESTATUS[0]}} -eq 0"


rule convergence:
    # Real training (scikit-learn's digits, MXNet and PyTorch) through PHub vs one process.
    input:
        RESULTS + "/build/selftest.json",
    output:
        RESULTS + "/points/convergence/curves.csv",
    log:
        RESULTS + "/logs/convergence.log",
    resources:
        bench=1,
    shell:
        "{PYTHON} -m phub.integrations.convergence --out {output} 2> {log}"
