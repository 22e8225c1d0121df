# Provision: check that this machine (or the cluster) can run the chosen network, record it.
# Locally each point brings its own emulated rack up and down (`python -m experiments bench ... --network emulated`),
# so a failed or interrupted point leaves nothing behind; this stage only checks and records.
# With `network: hostfile` the points run on the real machines a hostfile names (inside the SLURM
# allocation that holds them: `phub hostfile --from-slurm --out FILE` writes it); this stage
# checks the file and logs its nodes.


rule provision:
    output:
        results("provision/doctor.json"),
    log:
        results("logs/provision.log"),
    conda:
        ENV
    params:
        python=PYTHON,
        network=config["network"],
        hostfile=config.get("hostfile", ""),
    shell:
        "{params.python} -m phub doctor --json > {output}.tmp 2> {log} && "
        "{params.python} workflow/scripts/check_network.py {output}.tmp {params.network} {params.hostfile} 2>> {log} && "
        "mv {output}.tmp {output}"
