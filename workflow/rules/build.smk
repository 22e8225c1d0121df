# Build: the package is installed (editable) by `make venv`; compile check and self-test here.


rule build:
    input:
        RESULTS + "/provision/doctor.json",
    output:
        RESULTS + "/build/selftest.json",
    log:
        RESULTS + "/logs/build.log",
    shell:
        "{PYTHON} -m phub selftest > {output}.tmp 2> {log} && mv {output}.tmp {output}"
