#!/usr/bin/env bash
# Prepare a node for the nsjail runtime (node/fncall/nsjail). Idempotent; a no-op run
# takes well under a second.
#
#  * installs, via apt only, the shared library the bundled nsjail binary links against
#    and the toolchains the jails run (skipping packages that are already installed;
#    `apt-get update` runs only when something must be installed);
#  * creates the cgroup v1 parent directories the runtime puts each jail's groups under
#    (memory, pids, cpu, cpuacct), when this host has a v1 hierarchy (pure cgroup v2
#    hosts need no parent directory).
#
# Usage: scripts/setup-nsjail.sh            (as root)
#        CORRAL_NSJAIL_CGROUP_PARENT=NAME scripts/setup-nsjail.sh
set -euo pipefail

PACKAGES=(libnl-route-3-200 python3 g++ nodejs default-jdk-headless rustc)
CGROUP_PARENT="${CORRAL_NSJAIL_CGROUP_PARENT:-CORRAL}"
CGROUP_ROOT=/sys/fs/cgroup

if [[ $(id -u) -ne 0 ]]; then
    echo "setup-nsjail: must run as root" >&2
    exit 1
fi

"$(dirname "$0")/apt-ensure" setup-nsjail "${PACKAGES[@]}"

for controller in memory pids cpu cpuacct; do
    dir="$CGROUP_ROOT/$controller"
    # A v1 hierarchy is a mount of type "cgroup" (v2 is "cgroup2").
    if [[ -d "$dir" ]] && [[ "$(stat -f -c %T "$dir" 2>/dev/null)" == "cgroupfs" ]]; then
        mkdir -p "$dir/$CGROUP_PARENT"
        echo "setup-nsjail: cgroup v1 parent $dir/$CGROUP_PARENT ready"
    fi
done

echo "setup-nsjail: done"
