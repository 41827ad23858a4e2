#!/usr/bin/env bash
# The RDMA part of `make test`: install what the soft-RoCE VM needs, boot it once, run
# tests/rdma inside it. Where this machine cannot host the VM (exit 77 from the scripts), say
# why and succeed: the host suite has run; anything else is the suite's verdict.
#
#   bash scripts/rdma-tests.sh [VENV] [PYTEST ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
shift || true

bash scripts/rdma-vm-setup.sh "$VENV"
rc=$?
if [ "$rc" = 77 ]; then
    echo "rdma-tests: the soft-RoCE VM suite was NOT run (reason above)"
    exit 0
fi
[ "$rc" = 0 ] || { echo "rdma-tests: setting up the VM failed (exit $rc)"; exit "$rc"; }

RDMA_VM_VENV="$VENV" bash scripts/rdma-vm-run.sh "$@"
rc=$?
if [ "$rc" = 77 ]; then
    echo "rdma-tests: the soft-RoCE VM suite was NOT run (reason above)"
    exit 0
fi
exit "$rc"
