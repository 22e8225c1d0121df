# Experiments: one job per shape (the points that share one emulated rack); each point's tidy
# CSV is written atomically by run_shape.py as soon as it is measured, so a rerun skips finished
# points, also inside a shape that was interrupted.


# Two JSON writes: not worth a cluster job each (no effect on a local run).
localrules:
    point_list,
    shape_spec,


rule point_list:
    output:
        results("points/all.json"),
    log:
        results("logs/point_list.log"),
    conda:
        ENV
    params:
        value=point_outputs(),
    script:
        "../scripts/write_json.py"


rule shape_spec:
    output:
        results("shapes/{shape}.json"),
    log:
        results("logs/shapes/{shape}.spec.log"),
    conda:
        ENV
    params:
        value=lambda wildcards: SHAPES[wildcards.shape],
    script:
        "../scripts/write_json.py"


rule run_shape:
    input:
        selftest=results("build/selftest.json"),
        shape=results("shapes/{shape}.json"),
        progress=results("points/all.json"),
    output:
        results("shapes/{shape}.done"),
    log:
        results("logs/shapes/{shape}.log"),
    # A busy machine can make a rack's preflight miss its rates; one more try, then give up.
    retries: 1
    conda:
        ENV
    resources:
        # Points share the machine's cores and the emulated links: one at a time locally.
        bench=1,
    params:
        python=PYTHON,
        points=lambda wildcards, input: str(Path(input.progress).parent),
    shell:
        "{params.python} workflow/scripts/run_shape.py --shape {input.shape} --results {params.points} "
        "--done {output} --progress {input.progress} 2>&1 | tee {log}; test ${{PIPESTATUS[0]}} -eq 0"


rule convergence:
    # Real training (scikit-learn's digits, MXNet and PyTorch) through PHub vs one process.
    input:
        results("build/selftest.json"),
    output:
        results(CURVES),
    log:
        results("logs/convergence.log"),
    conda:
        ENV
    resources:
        bench=1,
    params:
        python=PYTHON,
    shell:
        "{params.python} -m experiments.convergence --out {output} 2> {log}"
