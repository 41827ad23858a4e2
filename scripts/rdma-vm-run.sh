#!/usr/bin/env bash
# Runs the tests/rdma/ suite on real RDMA verbs: boots ONE virtme-ng VM with Debian's stock
# kernel (the host kernel has no RDMA), brings up a soft-RoCE device rxe0 on a veth pair inside
# it, runs pytest on tests/rdma there and returns pytest's exit code. Output goes to stdout.
# See shared notes SOFT_ROCE.md for why it is done this way (TCG, one rxe device in loopback).
#
#   bash scripts/rdma-vm-setup.sh          # once: installs kernel, qemu, rdma-core, virtme-ng
#   bash scripts/rdma-vm-run.sh [PYTEST ARGS...]
#
# Environment (all optional):
#   RDMA_VM_VENV     the project venv whose Python runs the tests (default .venv)
#   RDMA_VM_TIMEOUT  seconds for boot + run before the VM is killed (default 900)
#   RDMA_VM_MEMORY   guest memory (default 2G)
#   RDMA_VM_CPUS     guest CPU count (default: vng's, all host CPUs)
#   RDMA_VM_VERBOSE  1: show the guest's kernel console too (to debug a boot)
#
# Exit codes: pytest's (0 all passed, 1 failures, ...); 77 this machine cannot run the VM (one
# line saying why); 70 rxe could not be brought up inside the guest; 71 the VM did not boot;
# 124 boot + run exceeded RDMA_VM_TIMEOUT (the VM is killed).
set -uo pipefail

SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MARK="rdma-vm:"

# --------------------------------------------------------------------------------------------
# Guest side: `bash rdma-vm-run.sh --in-guest VENV [PYTEST ARGS...]`, run by vng inside the VM.
# --------------------------------------------------------------------------------------------
if [ "${1:-}" = "--in-guest" ]; then
    VENV="$2"; shift 2
    fail() { echo "$MARK FAIL: $*"; exit 70; }
    # This branch adds links and mounts: never on the host.
    grep -q virtme /proc/cmdline || fail "--in-guest is for the virtme-ng guest only"
    echo "$MARK guest up: kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB"
    T_GUEST=$(date +%s)
    # The host's files are read-only here except for overlays (/tmp, /var, /etc, ...).
    export HOME=/tmp/rdma-vm-home PYTHONDONTWRITEBYTECODE=1 SLASHRT_IN_RDMA_VM=1
    export SLASHRT_RDMA_DEVICE=rxe0 SLASHRT_RDMA_GID_INDEX=1 SLASHRT_RDMA_ADDR=10.77.0.1
    mkdir -p "$HOME"

    # virtme-ng's 9p root has no cache: every lookup is a round trip to the host (~5 ms under
    # TCG), so starting pytest takes over a minute. The host also exports / as "slashrt_host";
    # mounted with cache=loose and bound over the project, the venv and the Python it is based
    # on, imports are about 3x faster. Without it (older vng, no tag) the tests still run.
    if grep -qx slashrt_host /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag 2>/dev/null \
        && mkdir -p /tmp/slashrt-host \
        && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro \
            slashrt_host /tmp/slashrt-host; then
        pyhome="$(sed -n 's/^home *= *//p' "$VENV/pyvenv.cfg" 2>/dev/null)"
        for d in "$ROOT" "$VENV" "${pyhome%/bin}"; do
            case "$d" in "" | / | "$ROOT"/*) continue ;; esac
            [ -d "/tmp/slashrt-host$d" ] && mount --bind "/tmp/slashrt-host$d" "$d"
        done
    else
        echo "$MARK note: no cached 9p export; imports will be slow"
    fi

    modprobe rdma_rxe || fail "modprobe rdma_rxe failed"
    ip link add veth0 type veth peer name veth1 || fail "cannot create the veth pair"
    ip addr add 10.77.0.1/24 dev veth0 || fail "cannot address veth0"
    ip link set veth1 up && ip link set veth0 up || fail "cannot bring the veth pair up"
    rdma link add rxe0 type rxe netdev veth0 || fail "rdma link add rxe0 failed"

    # The port goes ACTIVE and the RoCEv2 IPv4 GID appears shortly after `rdma link add`.
    gid_dir=/sys/class/infiniband/rxe0/ports/1
    for _ in $(seq 1 100); do
        if ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE \
            && [ "$(cat "$gid_dir/gid_attrs/types/1" 2>/dev/null)" = "RoCE v2" ]; then
            break
        fi
        sleep 0.1
    done
    ibv_devices | grep -qw rxe0 || fail "ibv_devices does not list rxe0"
    ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE || { ibv_devinfo -d rxe0; fail "rxe0 port 1 is not ACTIVE"; }
    [ "$(cat "$gid_dir/gid_attrs/types/1" 2>/dev/null)" = "RoCE v2" ] \
        || fail "rxe0 GID index 1 is not RoCE v2 ($(cat "$gid_dir/gid_attrs/types/1" 2>/dev/null))"
    echo "$MARK rxe0 ACTIVE on veth0 (10.77.0.1), GID[1] $(cat "$gid_dir/gids/1") RoCE v2," \
        "active MTU $(ibv_devinfo -d rxe0 | awk '/active_mtu/ {print $2}')," \
        "rdma-core $(dpkg-query -W -f='${Version}' rdma-core 2>/dev/null) ($(( $(date +%s) - T_GUEST )) s)"

    cd "$ROOT" || fail "cannot cd to $ROOT"
    "$VENV/bin/python" -m pytest tests/rdma -p no:cacheprovider -q --durations=10 "$@"
    rc=$?
    echo "$MARK pytest exit $rc after $(( $(date +%s) - T_GUEST )) s in the guest"
    exit "$rc"
fi

# --------------------------------------------------------------------------------------------
# Host side.
# --------------------------------------------------------------------------------------------
cannot() {
    echo "$MARK cannot run the RDMA VM tests here: $*"
    exit 77
}

cd "$ROOT"
VENV="${RDMA_VM_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
TIMEOUT="${RDMA_VM_TIMEOUT:-900}"

[ "$(id -u)" = 0 ] || cannot "not root"
[ -c /dev/null ] && [ -w /dev/null ] || cannot "no usable /dev"
command -v timeout >/dev/null 2>&1 || cannot "no 'timeout' command (coreutils)"
command -v qemu-system-x86_64 >/dev/null 2>&1 \
    || cannot "qemu-system-x86_64 is not installed (bash scripts/rdma-vm-setup.sh installs it)"
[ -x "$VENV/bin/python" ] || cannot "no venv at $VENV (make install, or bash scripts/rdma-vm-setup.sh)"
[ -x "$VENV/bin/vng" ] || cannot "virtme-ng is not installed in $VENV (bash scripts/rdma-vm-setup.sh)"
"$VENV/bin/python" -c 'import pyverbs.device' 2>/dev/null \
    || cannot "pyverbs is not importable from $VENV (bash scripts/rdma-vm-setup.sh)"
command -v busybox >/dev/null 2>&1 || cannot "busybox-static is not installed (bash scripts/rdma-vm-setup.sh)"

# Newest Debian kernel in /boot whose modules include rdma_rxe.
KVER=""
for img in /boot/vmlinuz-*-amd64; do
    [ -e "$img" ] || continue
    v="${img#/boot/vmlinuz-}"
    if ls /lib/modules/"$v"/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko* >/dev/null 2>&1; then
        KVER="$(printf '%s\n%s\n' "$KVER" "$v" | sed '/^$/d' | sort -V | tail -n 1)"
    fi
done
[ -n "$KVER" ] || cannot "no /boot/vmlinuz-*-amd64 with an rdma_rxe module (linux-image-amd64; bash scripts/rdma-vm-setup.sh)"

export PATH="$VENV/bin:$PATH"   # vng runs `virtme-run` from PATH
TMP="$(mktemp -d /tmp/slashrt-rdma-vm.XXXXXX)"
VM_PID=""
cleanup() {
    # timeout(1) leads its own process group (vng, virtme-run, qemu): end all of it.
    [ -n "$VM_PID" ] || VM_PID="$(cat "$TMP/pid" 2>/dev/null || true)"
    if [ -n "$VM_PID" ] && kill -0 -- "-$VM_PID" 2>/dev/null; then
        kill -TERM -- "-$VM_PID" 2>/dev/null
        sleep 2
        kill -KILL -- "-$VM_PID" 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "$MARK interrupted"; exit 130' INT TERM

VNG=(vng --disable-kvm --disable-microvm --force-9p -r "/boot/vmlinuz-$KVER" --user root
     --memory "${RDMA_VM_MEMORY:-2G}"
     # --force-9p: vng would first try virtiofs, but Debian 12 has only qemu's C virtiofsd,
     # which vng cannot drive; the failed attempt costs 3 s before vng falls back to 9p.
     # A second, read-only export of / that the guest mounts with caching (see --in-guest).
     --qemu-opts="-fsdev local,id=slashrt_host,path=/,security_model=none,readonly=on -device virtio-9p-pci,fsdev=slashrt_host,mount_tag=slashrt_host")
[ -n "${RDMA_VM_CPUS:-}" ] && VNG+=(--cpus "$RDMA_VM_CPUS")
[ "${RDMA_VM_VERBOSE:-0}" = 1 ] && VNG+=(--verbose)
GUEST_CMD="$(printf '%q ' bash "$SELF" --in-guest "$VENV" "$@")"

echo "$MARK booting kernel $KVER under qemu TCG ($(vng --version 2>/dev/null | head -n 1)), timeout ${TIMEOUT} s"
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }
T0=$(date +%s.%N)
{
    # --kill-after: qemu gets TERM at the deadline and KILL 15 s later. Standard input must be
    # given explicitly (vng crashes when it is closed, as under CI).
    timeout --kill-after=15 "$TIMEOUT" "${VNG[@]}" --exec "$GUEST_CMD" </dev/null 2>&1 &
    echo $! >"$TMP/pid"
    wait $!
    echo $? >"$TMP/rc"
} | while IFS= read -r line || [ -n "$line" ]; do
    printf '%s\n' "$line"
    case "$line" in
        "$MARK guest up:"*)
            [ -e "$TMP/booted" ] || { echo "$(date +%s.%N)" >"$TMP/booted"
                echo "$MARK booted in $(sub "$(cat "$TMP/booted")" "$T0") s"; } ;;
    esac
done &
# In the background so that INT/TERM reach the trap at once (wait is interruptible).
wait $!
VM_PID="$(cat "$TMP/pid" 2>/dev/null || true)"
RC="$(cat "$TMP/rc" 2>/dev/null || echo 1)"
T1=$(date +%s.%N)
TOTAL="$(sub "$T1" "$T0")"

if [ -e "$TMP/booted" ]; then
    BOOT="$(sub "$(cat "$TMP/booted")" "$T0")"
    RUN="$(sub "$T1" "$(cat "$TMP/booted")")"
    TIMING="boot ${BOOT} s + run ${RUN} s = ${TOTAL} s"
else
    TIMING="no boot after ${TOTAL} s"
fi

if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    if [ -e "$TMP/booted" ]; then
        echo "$MARK FAIL: TIMEOUT: the tests did not finish within ${TIMEOUT} s; VM killed ($TIMING)"
    else
        echo "$MARK FAIL: TIMEOUT: the VM did not boot within ${TIMEOUT} s; VM killed (RDMA_VM_VERBOSE=1 shows the console)"
    fi
    exit 124
fi
if [ ! -e "$TMP/booted" ]; then
    echo "$MARK FAIL: the VM did not boot (vng exit $RC after ${TOTAL} s; RDMA_VM_VERBOSE=1 shows the console)"
    exit 71
fi
echo "$MARK exit $RC ($TIMING)"
exit "$RC"
