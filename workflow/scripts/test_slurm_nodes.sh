#!/usr/bin/env bash
# `phub launch --from-slurm` across several SLURM nodes (part of `make test-slurm`, or alone):
# a cluster of emulated nodes (slurm_netns.sh: one slurmd per network namespace), an allocation
# of NODES of them (the first the PBox, the others one worker each), examples/torch_train.py
# launched there, and the same run on this machine with as many workers: both must print the
# same epoch lines. Run as root from the repository root, after `make venv`. The cluster is
# stopped at the end. Bounded: each launch by $PHUB_SLURM_TEST_TIMEOUT seconds (default 600).
#   PHUB_SLURM_NODES=3   nodes in the allocation (at least 3: a PBox and two workers)
set -euo pipefail

VENV=${VENV:-.venv}
NODES=${PHUB_SLURM_NODES:-3}
LIMIT=${PHUB_SLURM_TEST_TIMEOUT:-600}
CLUSTER=workflow/scripts/slurm_netns.sh
EXAMPLE=(python examples/torch_train.py --mode ddp --epochs 1)

fail() { echo "test-slurm-nodes: FAILED: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || fail "run as root (network namespaces and SLURM's daemons)"
((NODES >= 3)) || fail "PHUB_SLURM_NODES must be at least 3 (a PBox and two workers), got $NODES"
workers=$((NODES - 1))
trap '"$CLUSTER" stop || true' EXIT
"$CLUSTER" start "$NODES"

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
echo "test-slurm-nodes: OK: $workers workers on $((NODES - 1)) SLURM nodes (PBox phs-node1) printed the same" \
     "epoch line as on this machine: $got" >&2
