#!/usr/bin/env bash
# Installs what the soft-RoCE VM test harness (scripts/rdma-vm-run.sh) needs. Idempotent: a
# second run with everything present does no network access and takes about a second.
#
#   bash scripts/rdma-vm-setup.sh [VENV]      # VENV defaults to .venv (relative to the project)
#
# - Debian packages: a stock Debian kernel (has rdma_rxe), qemu, rdma-core userspace with the
#   rxe provider, perftest, Debian's pyverbs, iproute2/kmod for the guest, busybox for
#   virtme-ng's initramfs (it needs a static one).
# - virtme-ng into the project's venv (the `vng` command).
# - makes Debian's pyverbs importable from the venv's Python by symlinking just the `pyverbs`
#   package into the venv's site-packages (the venv's Python is a CPython 3.11 like Debian's).
#
# Exit codes: 0 ready; 77 this machine cannot host the VM (one line says why);
# anything else: an unexpected failure.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
T0=$(date +%s)

cannot() {
    echo "rdma-vm-setup: cannot run the RDMA VM tests here: $*"
    exit 77
}

DEB_PACKAGES=(
    linux-image-amd64 qemu-system-x86 rdma-core ibverbs-providers ibverbs-utils perftest
    libibverbs-dev python3-pyverbs iproute2 kmod busybox-static
)

[ "$(id -u)" = 0 ] || cannot "not root (installing Debian packages and booting the VM need root)"
command -v apt-get >/dev/null 2>&1 || cannot "no apt-get (not a Debian-based machine)"
command -v dpkg-query >/dev/null 2>&1 || cannot "no dpkg-query"

missing=()
for p in "${DEB_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    echo "rdma-vm-setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || cannot "apt-get update failed"
    for p in "${missing[@]}"; do
        if [ -z "$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}' | grep -v '(none)')" ]; then
            cannot "Debian package $p is not installable (no candidate version)"
        fi
    done
    # --no-install-recommends: the kernel would otherwise pull firmware and apparmor, qemu
    # a pile of UI and firmware packages the harness never uses. INITRD=No: the kernel's
    # postinst skips building an initramfs (about 25 s); virtme-ng makes its own.
    INITRD=No apt-get install -y -qq --no-install-recommends "${missing[@]}" \
        >/tmp/rdma-vm-setup-apt.log 2>&1 || {
        tail -n 30 /tmp/rdma-vm-setup-apt.log >&2
        cannot "apt-get install ${missing[*]} failed (log above, full log in /tmp/rdma-vm-setup-apt.log)"
    }
fi

ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1 || cannot "no /boot/vmlinuz-*-amd64 after installing linux-image-amd64"

# The project's venv (the Makefile creates it the same way; create it here if run on its own).
if [ ! -x "$VENV/bin/python" ]; then
    echo "rdma-vm-setup: creating $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e '.[test]'
fi
PY="$VENV/bin/python"

if [ ! -x "$VENV/bin/vng" ]; then
    echo "rdma-vm-setup: installing virtme-ng into $VENV"
    "$PY" -m pip install --quiet 'virtme-ng>=1.42,<2'
fi

# pyverbs: Debian's build lives in /usr/lib/python3/dist-packages/pyverbs. Link only that
# package into the venv (adding all of dist-packages to sys.path would shadow the venv's own
# numpy, etc. with Debian's).
DEB_PYVERBS=/usr/lib/python3/dist-packages/pyverbs
[ -d "$DEB_PYVERBS" ] || cannot "python3-pyverbs installed but $DEB_PYVERBS is missing"
VENV_PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
DEB_PYVER=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$VENV_PYVER" = "$DEB_PYVER" ] \
    || cannot "Debian's pyverbs is built for Python $DEB_PYVER, the venv runs Python $VENV_PYVER"
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "$(readlink "$SITE/pyverbs" 2>/dev/null || true)" != "$DEB_PYVERBS" ]; then
    rm -rf "$SITE/pyverbs"
    ln -s "$DEB_PYVERBS" "$SITE/pyverbs"
fi
"$PY" -c 'import pyverbs.device, pyverbs.qp, pyverbs.mr, pyverbs.cq, pyverbs.pd' \
    || { echo "rdma-vm-setup: 'import pyverbs' fails in $VENV" >&2; exit 1; }

# Spark's JVM in the guest maps the classes a small job loads from an archive dumped here once
# (tests/rdma/_spark_jvm.py): under the emulated CPU loading them took most of a minute and more
"$PY" tests/rdma/_spark_jvm.py

echo "rdma-vm-setup: ready ($(ls /boot/vmlinuz-*-amd64 | tail -n 1), $("$VENV/bin/vng" --version 2>/dev/null | head -n 1), pyverbs linked into $SITE) in $(( $(date +%s) - T0 )) s"
