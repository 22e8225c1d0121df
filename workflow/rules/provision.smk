# Provision: check that this machine (or the cluster) can run the chosen network, record it.
# Locally each point brings its own emulated rack up and down (`phub bench ... --network emulated`),
# so a failed or interrupted point leaves nothing behind; this stage only checks and records.


rule provision:
    output:
        RESULTS + "/provision/doctor.json",
    log:
        RESULTS + "/logs/provision.log",
    params:
        network=config["network"],
    shell:
        "{PYTHON} -m phub doctor --json > {output}.tmp 2> {log} && "
        "{PYTHON} workflow/scripts/check_network.py {output}.tmp {params.network} 2>> {log} && "
        "mv {output}.tmp {output}"
