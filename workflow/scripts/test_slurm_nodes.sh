#!/usr/bin/env bash
# Several SLURM nodes (part of `make test-slurm`, or alone): a cluster of emulated nodes
# (slurm_netns.sh: one slurmd per network namespace, accounting on the controller's side), then
#  1. `phub launch --from-slurm`: an allocation of NODES of them (the first the PBox, the others
#     one worker each), examples/torch_train.py launched there, and the same run on this machine
#     with as many workers: both must print the same epoch lines;
#  2. the pipeline's `network: hostfile` through profiles/cluster: `phub hostfile --from-slurm`
#     writes the hostfile of an allocation of the NODES nodes (their eth0 addresses), then a few
#     quick-grid points run with it, each shape's job holding those nodes (PHUB_SLURM_NODELIST)
#     and its points' processes srun steps on them. Checked: each point's CSV has rows, measured
#     on network hostfile on a node of the cluster; every job went through SLURM and completed
#     (sacct); the steps of each shape's job ran on more than one node, all of the hostfile's.
# Run as root from the repository root, after `make venv`. The cluster is stopped at the end.
# Bounded: each launch, and the pipeline, by $PHUB_SLURM_TEST_TIMEOUT seconds (default 600).
#   PHUB_SLURM_NODES=3                 nodes of the cluster (at least 3: a PBox and two workers)
#   PHUB_SLURM_NODES_POINTS=capacity/k1-n2   the points of part 2 (quick grid keys; a PBox has one
#                                      address here, so points of one interface)
#   PHUB_SLURM_NODES_RESULTS=results/slurm-test-nodes   where they go (emptied first)
set -euo pipefail

VENV=${VENV:-.venv}
NODES=${PHUB_SLURM_NODES:-3}
POINTS=${PHUB_SLURM_NODES_POINTS:-capacity/k1-n2}
RESULTS=${PHUB_SLURM_NODES_RESULTS:-results/slurm-test-nodes}
LIMIT=${PHUB_SLURM_TEST_TIMEOUT:-600}
CLUSTER=workflow/scripts/slurm_netns.sh
EXAMPLE=(python examples/torch_train.py --mode ddp --epochs 1)

SLURM_RUN=("$CLUSTER" run)  # SLURM's commands reach the cluster from the controller's namespace
note() { echo "test-slurm-nodes: $*" >&2; }
fail() { echo "test-slurm-nodes: FAILED: $*" >&2; exit 1; }
# shellcheck source=workflow/scripts/test_slurm_pipeline.sh
source "$(dirname "${BASH_SOURCE[0]}")/test_slurm_pipeline.sh"

[[ $(id -u) == 0 ]] || fail "run as root (network namespaces and SLURM's daemons)"
((NODES >= 3)) || fail "PHUB_SLURM_NODES must be at least 3 (a PBox and two workers), got $NODES"
[[ -x $VENV/bin/snakemake ]] || fail "no $VENV/bin/snakemake: run \`make venv\` first"
workers=$((NODES - 1))
export USER=${USER:-$(id -un)}  # the slurm executor reads it
trap '"$CLUSTER" stop || true' EXIT
"$CLUSTER" start "$NODES"

# 1. phub launch --from-slurm.
epochs() { sed -n 's/^\[[^]]*\] \(epoch [0-9]*:.*\)$/\1/p'; }

export OMP_NUM_THREADS=1
here=$(timeout "$LIMIT" "$VENV/bin/python" -m phub launch -n "$workers" --timeout 120 -- "${EXAMPLE[@]}" 2>&1) \
    || fail "the run on this machine failed: $(tail -n 20 <<<"$here")"
# The nodes' host names resolve nowhere: gloo (DDP's setup) is told which interface to advertise.
set +e
spread=$(GLOO_SOCKET_IFNAME=eth0 timeout "$LIMIT" "$CLUSTER" run salloc --nodes="$NODES" --time=10 \
    "$VENV/bin/python" -m phub launch --from-slurm --timeout 120 -- "${EXAMPLE[@]}" 2>&1)
rc=$?
set -e
((rc == 0)) || fail "phub launch --from-slurm on $NODES nodes failed (exit $rc): $(tail -n 30 <<<"$spread")"
expected=$(epochs <<<"$here")
got=$(epochs <<<"$spread")
[[ -n $expected && $got == "$expected" ]] || fail "the epoch lines differ: here '$expected', on the nodes '$got'"
for ((i = 2; i <= NODES; i++)); do
    grep -q "^\[phs-node$i rank $((i - 2))\] " <<<"$spread" || fail "no output of rank $((i - 2)) from node phs-node$i"
done
grep -q "^phub: PHub carried 1 job(s), $workers worker(s)" <<<"$spread" || fail "no line on what PHub carried"
note "OK: $workers workers on $((NODES - 1)) SLURM nodes (PBox phs-node1) printed the same epoch line as on" \
     "this machine: $got"

# 2. The pipeline, network: hostfile, through profiles/cluster.
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
hosts=$RESULTS/hosts.yaml
set +e
listed=$(timeout 120 "$CLUSTER" run salloc --nodes="$NODES" --time=5 "$VENV/bin/python" -m phub hostfile \
    --from-slurm --interface-regex eth0 --out "$hosts" 2>&1)
rc=$?
set -e
((rc == 0)) || fail "phub hostfile --from-slurm on $NODES nodes failed (exit $rc): $listed"
hostnodes=$("$VENV/bin/python" -c '
import sys, yaml
data = yaml.safe_load(open(sys.argv[1]))
print(",".join(node["name"] for role in ("pboxes", "workers") for node in data[role]))' "$hosts")
(($(tr , '\n' <<<"$hostnodes" | sort -u | wc -l) == NODES)) \
    || fail "the hostfile of $NODES nodes names '$hostnodes': $listed"
overrides=(network=hostfile hostfile="$hosts")
# shellcheck disable=SC2086
SHAPES=$(quick_shapes "${overrides[@]}" -- $POINTS) || fail "unknown point in: $POINTS"
targets=()
for s in $SHAPES; do targets+=("$RESULTS/shapes/$s.done"); done
csvs=()
for p in $POINTS; do csvs+=("$RESULTS/points/$p.csv"); done
PHUB_SLURM_PARTITION=netns PHUB_SLURM_NODELIST=$hostnodes PHUB_SLURM_CPUS=${PHUB_SLURM_CPUS:-$(nproc)} \
    run_pipeline "$RESULTS" "${overrides[@]}" -- "${targets[@]}"
check_files "$RESULTS/build/selftest.json" "${targets[@]}" "${csvs[@]}"
# shellcheck disable=SC2086
check_jobs_completed "$RESULTS/snakemake.log" $SHAPES
# Each point's rows: measured on the hostfile's network, by a job on one of its nodes.
for f in "${csvs[@]}"; do
    "$VENV/bin/python" - "$f" "$hostnodes" <<'PY' || fail "$f: not measured on network hostfile on a node of the hostfile"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
sys.exit(not rows or any(r["network"] != "hostfile" or r["host"] not in sys.argv[2].split(",") for r in rows))
PY
done
# Each shape's job: its points' processes (the PBox server, the workers) are srun steps, and they
# ran on more than one node, every one of them a node of the hostfile.
for s in $SHAPES; do
    job=$(grep "|rule_run_shape_wildcards_${s}\$" <<<"$ACCT" | cut -d'|' -f1)
    steps=$(timeout 30 "$CLUSTER" run sacct -n -P -j "$job" -o JobID,NodeList,State | grep "^$job\.[0-9]" || true)
    while IFS= read -r line; do note "sacct: $line"; done <<<"$steps"
    used=$(cut -d'|' -f2 <<<"$steps" | sort -u)
    (($(wc -l <<<"$used") >= 2)) || fail "the steps of job $job (shape $s) ran on one node only: $used"
    for node in $used; do
        [[ ,$hostnodes, == *,"$node",* ]] || fail "a step of job $job ran on $node, not a node of the hostfile"
    done
    note "OK: shape $s (job $job): steps on $(paste -sd' ' <<<"$used")"
done
note "OK: ${#JOB_IDS[@]} jobs ran through SLURM (${JOB_IDS[*]}) with network: hostfile on nodes $hostnodes;" \
     "$(wc -w <<<"$POINTS") point(s) written under $RESULTS"
