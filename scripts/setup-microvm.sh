#!/usr/bin/env bash
# Prepare a node for microVM sandboxes (node/sandboxes/microvm, docs/microvm.md).
# Idempotent and quick when done:
#
#  * installs, via apt only, QEMU 7.2 (qemu-system-x86: `-M microvm`; qemu-utils:
#    qemu-img), the guest kernel linux-image-cloud-amd64 (PVH, virtio as modules),
#    busybox-static and e2fsprogs (the initramfs; mkfs.ext4 -d for root disks) and lz4
#    (the cloud kernel's payload is LZ4);
#  * creates the system user corral-vm that QEMU runs as (root only);
#  * extracts the guest's PVH vmlinux from the cloud kernel into var/microvm/kernel/
#    (node/sandboxes/microvm/artifacts.py; the initramfs and disks are built on demand).
set -euo pipefail

cd "$(dirname "$0")/.."

scripts/apt-ensure setup-microvm qemu-system-x86 qemu-utils linux-image-cloud-amd64 \
    busybox-static e2fsprogs lz4 util-linux

if ! getent passwd corral-vm >/dev/null; then
    if [[ $(id -u) -eq 0 ]]; then
        useradd --system --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin --user-group corral-vm
        echo "setup-microvm: created the system user corral-vm"
    else
        echo "setup-microvm: must run as root to create the user corral-vm" >&2
    fi
fi
if getent group kvm >/dev/null && getent passwd corral-vm >/dev/null \
    && ! id -nG corral-vm | grep -qw kvm && [[ $(id -u) -eq 0 ]]; then
    usermod -a -G kvm corral-vm
fi

py=.venv/bin/python
[[ -x $py ]] || py=${CORRAL_PYTHON:-$(scripts/find-python)}
PYTHONPATH=$PWD $py -m node.sandboxes.microvm.artifacts var/microvm
echo "setup-microvm: done"
