# The pipeline part of the SLURM tests (sourced by test_slurm.sh and test_slurm_nodes.sh, not run):
# quick-grid points through `snakemake --profile profiles/cluster`, and the checks that their
# files exist and that every job went through SLURM and completed there.
#
# The caller sets VENV (the venv with snakemake), LIMIT (the pipeline's bound in seconds) and
# SLURM_RUN (the argv prefix that reaches the cluster's controller; empty: here), and defines
# `note MESSAGE` and `fail MESSAGE` (which exits).
# shellcheck shell=bash

# quick_shapes [KEY=VALUE...] -- POINT...: the shapes (one SLURM job each) of the quick grid's
# POINTS, with the config keys KEY overridden (VALUE read as YAML).
quick_shapes() {
    "$VENV/bin/python" - "$@" <<'PY'
import sys, yaml
sys.path.insert(0, "workflow/scripts")
import points
args = sys.argv[1:]
split = args.index("--")
config = yaml.safe_load(open("config/quick.yaml"))
config.update({k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in args[:split])})
grid = points.by_key(config)
print(" ".join(sorted({grid[key]["shape"] for key in args[split + 1:]})))
PY
}

# run_pipeline RESULTS [KEY=VALUE...] -- TARGET...: the quick grid's TARGETS through the cluster
# profile into RESULTS (a folder that exists), config keys overridden; log: RESULTS/snakemake.log.
# Fails the test, with the log's last lines, if snakemake fails or runs past $LIMIT s.
run_pipeline() {
    local results=$1 config=() rc start
    shift
    while [[ $1 != -- ]]; do config+=("$1"); shift; done
    shift
    start=$(date +%s)
    note "running the pipeline through SLURM (log: $results/snakemake.log)"
    set +e
    timeout "$LIMIT" "${SLURM_RUN[@]}" "$VENV/bin/snakemake" --profile profiles/cluster --configfile config/quick.yaml \
        --config results_dir="$results" "${config[@]}" -- "$@" >"$results/snakemake.log" 2>&1
    rc=$?
    set -e
    note "snakemake exited with $rc after $(($(date +%s) - start)) s"
    if ((rc != 0)); then
        tail -n 40 "$results/snakemake.log" >&2
        ((rc == 124)) && fail "the pipeline ran past ${LIMIT} s"
        fail "snakemake failed (exit $rc)"
    fi
}

# check_files FILE...: each exists and is not empty; each .csv among them has data rows.
check_files() {
    local f
    for f in "$@"; do
        [[ -s $f ]] || fail "missing or empty: $f"
        [[ $f != *.csv ]] || (($(wc -l <"$f") >= 2)) || fail "$f has no data rows"
    done
}

# check_jobs_completed LOG SHAPE...: every job of the run went through SLURM and completed there:
# the executor logs one SLURM job id per job; sacct (the accounting database) must know each as
# COMPLETED, and the jobs must cover provision, build and every SHAPE. Sets JOB_IDS (the ids)
# and ACCT (sacct's lines JobID|NodeList|Start|End|State|Comment, one per job).
check_jobs_completed() {
    local log=$1 expected rule s line
    shift
    mapfile -t JOB_IDS < <(sed -n 's/.*submitted with SLURM jobid \([0-9][0-9]*\).*/\1/p' "$log" | sort -u)
    expected=$((2 + $#))
    ((${#JOB_IDS[@]} == expected)) \
        || fail "expected $expected SLURM jobs (provision, build, one per shape), the log names ${#JOB_IDS[@]}"
    ACCT=$(timeout 30 "${SLURM_RUN[@]}" sacct -X -n -P -j "$(IFS=,; echo "${JOB_IDS[*]}")" \
        -o JobID,NodeList,Start,End,State,Comment)
    while IFS= read -r line; do note "sacct: $line"; done <<<"$ACCT"
    (($(grep -c '|COMPLETED|' <<<"$ACCT") == expected)) || fail "not every SLURM job is COMPLETED in sacct"
    for rule in rule_provision rule_build; do
        grep -q "|$rule\$" <<<"$ACCT" || fail "no completed SLURM job for ${rule#rule_}"
    done
    for s in "$@"; do
        grep -q "|rule_run_shape_wildcards_${s}\$" <<<"$ACCT" || fail "no completed SLURM job for shape $s"
    done
}
