# The PHub reproduction: provision -> build -> experiments -> figures -> report.
#   snakemake --profile profiles/local                       (the local default, emulated rack)
#   snakemake --profile profiles/local --configfile config/quick.yaml
#   snakemake --profile profiles/cluster                     (SLURM)
from snakemake.utils import min_version, validate

min_version("8.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/provision.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/software_cost.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        results("report.md"),
        expand(results("figures/{figure}.png"), figure=FIGURES),
        results("figures/software_cost.png"),
