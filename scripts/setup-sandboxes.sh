#!/usr/bin/env bash
# Prepare a node for container sandboxes (node/sandboxes). Idempotent and quick when
# done:
#
#  * installs, via apt only, crun and runc (the OCI runtimes), gcc and libc6-dev (for
#    corral-init, PID 1 of every sandbox), util-linux (unshare: sandboxes' user
#    namespaces) and lxcfs (sandboxes' own /proc figures; the node starts it);
#  * builds node/sandboxes/guest/bin/corral-init, static, when its source is newer;
#  * on a hybrid cgroup layout, mounts the v1 hugetlb controller crun needs (once per boot;
#    the backend does it too when it starts as root).
set -euo pipefail

cd "$(dirname "$0")/.."

scripts/apt-ensure setup-sandboxes crun runc gcc libc6-dev nftables iproute2 util-linux lxcfs

src=node/sandboxes/guest/corral-init.c
bin=node/sandboxes/guest/bin/corral-init
if [[ ! -x "$bin" || "$src" -nt "$bin" ]]; then
    mkdir -p "$(dirname "$bin")"
    gcc -static -O2 -Wall -Werror -o "$bin.tmp" "$src"
    mv "$bin.tmp" "$bin"
    echo "setup-sandboxes: built $bin"
fi

src=node/sandboxes/guest/corral-vmagent.c
bin=node/sandboxes/guest/bin/corral-vmagent
if [[ ! -x "$bin" || "$src" -nt "$bin" ]]; then
    mkdir -p "$(dirname "$bin")"
    gcc -static -O2 -Wall -Werror -o "$bin.tmp" "$src"
    mv "$bin.tmp" "$bin"
    echo "setup-sandboxes: built $bin"
fi

if [[ -d /sys/fs/cgroup/memory ]] && ! mountpoint -q /sys/fs/cgroup/hugetlb; then
    if [[ $(id -u) -eq 0 ]]; then
        mkdir -p /sys/fs/cgroup/hugetlb
        mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb
        echo "setup-sandboxes: mounted the hugetlb cgroup controller (crun needs it on v1)"
    fi
fi
echo "setup-sandboxes: done"
