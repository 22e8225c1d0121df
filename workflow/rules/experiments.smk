# Experiments: one job per shape (the points that share one emulated rack); each point's tidy
# CSV is written atomically by run_shape.py as soon as it is measured, so a rerun skips finished
# points, also inside a shape that was interrupted.

# Two JSON writes: not worth a cluster job each (no effect on a local run).
localrules:
    point_list,
    shape_spec,


rule point_list:
    output:
        RESULTS + "/points/all.json",
    run:
        Path(output[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(output[0]).write_text(json.dumps(point_outputs()))


rule shape_spec:
    output:
        RESULTS + "/shapes/{shape}.json",
    run:
        Path(output[0]).write_text(json.dumps(SHAPES[wildcards.shape]))


rule run_shape:
    input:
        selftest=RESULTS + "/build/selftest.json",
        shape=RESULTS + "/shapes/{shape}.json",
        progress=RESULTS + "/points/all.json",
    output:
        RESULTS + "/shapes/{shape}.done",
    log:
        RESULTS + "/logs/shapes/{shape}.log",
    resources:
        # Points share the machine's cores and the emulated links: one at a time locally.
        bench=1,
    # A busy machine can make a rack's preflight miss its rates; one more try, then give up.
    retries: 1
    shell:
        "{PYTHON} workflow/scripts/run_shape.py --shape {input.shape} --results {RESULTS}/points "
        "--done {output} --progress {input.progress} 2>&1 | tee {log}; test ${{PIPESTATUS[0]}} -eq 0"


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
