#!/usr/bin/env bash
# The SLURM test (`make test-slurm`): a one-node cluster on this machine (slurm_localhost.sh),
# a few experiment points of config/quick.yaml submitted through profiles/cluster, then checks
# that their files exist and that every job of the run went through SLURM and completed there;
# then an exchange whose processes srun places on the nodes of a hostfile (network: hostfile);
# then several SLURM nodes (test_slurm_nodes.sh: one slurmd per network namespace, with
# accounting): `phub launch --from-slurm` across them, checked for the same losses as on this
# machine, and the pipeline through profiles/cluster with `network: hostfile` on a hostfile of
# those nodes, checked like the one-node run and for points whose processes ran on several nodes.
# Run as root from the repository root, after `make venv`. Bounded by $PHUB_SLURM_TEST_TIMEOUT
# seconds (default 600) for each pipeline run. The one-node cluster is stopped at the end unless
# it was already up before the test; the multi-node one always is.
#   PHUB_SLURM_POINTS="scaling/phub-n1 scaling/gloo-ring-n2"   the points to run (quick grid keys;
#                                                              their shapes run, one job each)
#   PHUB_SLURM_RESULTS=results/slurm-test                      where they go (emptied first)
set -euo pipefail

VENV=${VENV:-.venv}
RESULTS=${PHUB_SLURM_RESULTS:-results/slurm-test}
POINTS=${PHUB_SLURM_POINTS:-scaling/phub-n1 scaling/gloo-ring-n2}
LIMIT=${PHUB_SLURM_TEST_TIMEOUT:-600}
CLUSTER=workflow/scripts/slurm_localhost.sh

SLURM_RUN=()  # SLURM's commands reach the cluster from here
note() { echo "test-slurm: $*" >&2; }
fail() { echo "test-slurm: FAILED: $*" >&2; exit 1; }
# shellcheck source=workflow/scripts/test_slurm_pipeline.sh
source "$(dirname "${BASH_SOURCE[0]}")/test_slurm_pipeline.sh"

[[ $(id -u) == 0 ]] || fail "run as root (the test installs and starts SLURM; the emulated rack needs root)"
[[ -x $VENV/bin/snakemake ]] || fail "no $VENV/bin/snakemake: run \`make venv\` first"

# The slurm executor reads $USER (to look up accounts); a bare root shell may not set it.
export USER=${USER:-$(id -un)}
# Every SLURM command here (scancel included) talks to the test cluster, never to another one.
eval "$("$CLUSTER" env)"
export SLURM_CONF
was_up=0
"$CLUSTER" status >/dev/null 2>&1 && was_up=1
cleanup() {
    local rc=$?
    if ((was_up)); then
        echo "test-slurm: the cluster was up before the test; leaving it running" >&2
    else
        timeout 30 scancel --user="$USER" >/dev/null 2>&1 || true  # nothing of ours left queued
        "$CLUSTER" stop || true
    fi
    exit "$rc"
}
trap cleanup EXIT
"$CLUSTER" start
export PHUB_SLURM_CPUS=${PHUB_SLURM_CPUS:-$(nproc)}

# A point runs inside its shape's job (the points that share one rack): the targets are the shapes.
# shellcheck disable=SC2086
SHAPES=$(quick_shapes -- $POINTS) || fail "unknown point in: $POINTS"
targets=()
for s in $SHAPES; do targets+=("$RESULTS/shapes/$s.done"); done
csvs=()
for p in $POINTS; do csvs+=("$RESULTS/points/$p.csv"); done
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
run_pipeline "$RESULTS" -- "${targets[@]}"

# 1. The files: the build's self-test and one CSV per point, with rows.
check_files "$RESULTS/build/selftest.json" "${targets[@]}" "${csvs[@]}"
# 2. Every submitted job went through SLURM and completed there.
# shellcheck disable=SC2086
check_jobs_completed "$RESULTS/snakemake.log" $SHAPES
# 3. A shape takes the whole node: on this one-node cluster no two shapes ran at the same time.
overlap=$(grep '|rule_run_shape_' <<<"$ACCT" | awk -F'|' '
    { start[NR] = $3; end[NR] = $4 }
    END { for (i = 1; i <= NR; i++) for (j = i + 1; j <= NR; j++)
              if (start[i] < end[j] && start[j] < end[i]) print start[i] "-" end[i] " and " start[j] "-" end[j] }')
[[ -z $overlap ]] || fail "shapes overlapped on the node (not exclusive): $overlap"
note "OK: ${#JOB_IDS[@]} jobs ran through SLURM (${JOB_IDS[*]}), $(wc -w <<<"$POINTS") points written under $RESULTS"

# 4. Placement by srun (network: hostfile): inside an allocation, `phub hostfile --from-slurm`
# reads the allocation (one node here: too few for a PBox and a worker, which it must say), and
# an exchange whose every process srun starts as a step on the node named in a hostfile
# (the node's loopback addresses tell the roles apart) verifies against the oracle.
node=$(hostname -s)
hosts=$RESULTS/hosts.yaml
cat >"$hosts" <<HOSTS
launcher: srun
pboxes: [{name: $node, addresses: [127.6.0.1, 127.6.0.2]}]
workers: [{name: $node, addresses: [127.6.1.1]}, {name: $node, addresses: [127.6.1.2]}]
HOSTS
set +e
from_slurm=$(timeout 120 salloc --nodes=1 --time=5 "$VENV/bin/python" -m phub hostfile --from-slurm 2>&1)
rc=$?
set -e
((rc == 2)) && grep -q "the allocation has 1 node(s) ($node)" <<<"$from_slurm" \
    || fail "phub hostfile --from-slurm in a one-node allocation: expected exit 2 naming the node, got $rc: $from_slurm"
set +e
placed=$(timeout 300 salloc --nodes=1 --time=5 "$VENV/bin/python" -m experiments bench exchange --network hostfile \
    --spec "$hosts" --system phub --workers 2 --num-interfaces 2 --model synthetic:2 --iterations 2 --verify --json 2>&1)
rc=$?
set -e
row=$(grep '^{' <<<"$placed" | tail -n 1)
((rc == 0)) && grep -q '"verified": true' <<<"$row" && grep -q '"launcher": "srun"' <<<"$row" \
    || fail "an exchange placed by srun (network: hostfile) did not verify (exit $rc): $(tail -n 20 <<<"$placed")"
# The allocation's steps: one per process the exchange started (the PBox server, two workers).
job=$(sed -n 's/.*Granted job allocation \([0-9][0-9]*\).*/\1/p' <<<"$placed" | head -n 1)
steps=$(timeout 30 sacct -n -P -j "$job" -o JobID | grep -c "^$job\.[0-9]" || true)
((steps >= 3)) || fail "allocation $job ran $steps srun steps; the exchange needs one per process (3)"
echo "test-slurm: OK: srun placed a PBox and 2 workers from a hostfile ($steps steps of job $job); it verified" >&2

# 5. Several SLURM nodes: an allocation of emulated nodes (one slurmd per network namespace), a PBox
# and two workers, `phub launch --from-slurm` training examples/torch_train.py there.
workflow/scripts/test_slurm_nodes.sh || fail "phub launch --from-slurm across several SLURM nodes (see above)"
