# Build: the package is installed (editable) by `make venv`; compile check and self-test here.


rule build:
    input:
        results("provision/doctor.json"),
    output:
        results("build/selftest.json"),
    log:
        results("logs/build.log"),
    conda:
        ENV
    params:
        python=PYTHON,
    shell:
        "{params.python} -m phub selftest > {output}.tmp 2> {log} && mv {output}.tmp {output}"
