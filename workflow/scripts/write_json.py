"""A Snakemake `script:`: write the rule's `params.value` as JSON to its one output."""
import json
from pathlib import Path

output = Path(snakemake.output[0])  # noqa: F821 (Snakemake defines it)
output.parent.mkdir(parents=True, exist_ok=True)
output.write_text(json.dumps(snakemake.params.value))  # noqa: F821
