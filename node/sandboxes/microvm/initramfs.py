"""The guest's initramfs: a newc cpio (gzip) of busybox-static, the kernel modules the
root disk and the agent's ports need, resize2fs (with its libraries, run through their own
loader: ``GROW_FS_ARGV``), the agent, and the
``/init`` script below (docs/microvm.md, "The guest").
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: the agent's ports (virtio-serial port names; docs/microvm.md)
CTL_PORT = "corral.ctl"
DATA_PORT = "corral.data"

#: modules the guest needs, loaded with their dependencies first (modules.dep); the ones
#: a kernel has built in are left out
GUEST_MODULES = ("virtio_mmio", "virtio_console", "virtio_blk", "ext4")

#: where the agent lands in the new root (a tmpfs of its own)
AGENT_DIR = "/.corral"
AGENT_NAME = "corral-vmagent"
#: resize2fs and the libraries it loads (the loader as ``lib/ld.so``), in the initramfs at
#: ``/tools`` and copied to ``/.corral/tools`` in the new root
TOOLS = "tools"

#: the command that grows the root file system to its disk (after ``Vm.resize_disk``):
#: it runs from the agent's tmpfs whatever the image holds
GROW_FS_ARGV = (
    f"{AGENT_DIR}/{TOOLS}/lib/ld.so",
    "--library-path",
    f"{AGENT_DIR}/{TOOLS}/lib",
    f"{AGENT_DIR}/{TOOLS}/resize2fs",
    "/dev/vda",
)

# PID 1 of the initramfs. It prints every failure on the serial console and then ends
# the machine: `reboot -f` (reboot=t on the kernel command line, and QEMU's -no-reboot
# turns a reset into QEMU's exit); should that fail, init exits, the kernel panics and
# panic=-1 does the same. So a broken guest ends, it never hangs.
INIT_SCRIPT = r"""#!/bin/busybox sh
# corral microVM init (initramfs PID 1): see node/sandboxes/microvm/initramfs.py
/bin/busybox --install -s /bin
PATH=/bin
export PATH
fail() {
    echo "corral-init: FATAL: $*"
    echo "corral-init: ending the machine"
    sync
    reboot -f
    sleep 1
    exit 1
}
mount -t proc proc /proc || fail "cannot mount /proc"
mount -t sysfs sysfs /sys || fail "cannot mount /sys"
mount -t devtmpfs devtmpfs /dev || fail "cannot mount /dev"
for m in $(cat /etc/corral/modules); do
    insmod "/lib/modules/$m" || fail "cannot load the module $m"
done
i=0
while [ ! -b /dev/vda ]; do
    i=$((i + 1))
    [ $i -le 300 ] || fail "no root disk (/dev/vda) after 3 s"
    usleep 10000
done
mount -t ext4 -o noinit_itable /dev/vda /newroot || fail "cannot mount the root disk /dev/vda"
# the overlay may be larger than the image's file system: grow it online to the disk
# (the superblock's block count and block size against the disk's 512-byte sectors)
set -- $(dd if=/dev/vda bs=1024 skip=1 count=1 2>/dev/null | od -An -tu4 -N28 -v)
[ $# -eq 7 ] || fail "cannot read the root disk's superblock"
if [ $(($(cat /sys/block/vda/size) * 512)) -gt $(($2 * (1024 << $7))) ]; then
    /tools/lib/ld.so --library-path /tools/lib /tools/resize2fs /dev/vda > /tmp/resize.log 2>&1 \
        || fail "resize2fs /dev/vda: $(cat /tmp/resize.log)"
fi
[ -d /newroot/.corral ] || mkdir -m 0755 /newroot/.corral || fail "cannot make /.corral"
mount -t tmpfs -o size=16m,mode=0755,nosuid,nodev corral /newroot/.corral \
    || fail "cannot mount /.corral"
cp /corral-vmagent /newroot/.corral/corral-vmagent && chmod 0755 /newroot/.corral/corral-vmagent \
    || fail "cannot copy the agent"
cp -a /tools /newroot/.corral/tools || fail "cannot copy the tools"
ctl=
data=
i=0
while [ -z "$ctl" ] || [ -z "$data" ]; do
    for p in /sys/class/virtio-ports/vport*; do
        [ -r "$p/name" ] || continue
        case "$(cat "$p/name")" in
            corral.ctl) ctl=/dev/${p##*/} ;;
            corral.data) data=/dev/${p##*/} ;;
        esac
    done
    [ -n "$ctl" ] && [ -n "$data" ] && break
    i=$((i + 1))
    [ $i -le 300 ] || fail "no ports corral.ctl/corral.data (ctl=$ctl data=$data)"
    usleep 10000
done
for d in proc sys dev; do
    [ -d "/newroot/$d" ] || mkdir -m 0555 "/newroot/$d" || fail "cannot make /$d in the root"
done
[ -d /newroot/tmp ] || mkdir -m 1777 /newroot/tmp || fail "cannot make /tmp in the root"
mount --move /dev /newroot/dev || fail "cannot move /dev"
mount --move /proc /newroot/proc || fail "cannot move /proc"
mount --move /sys /newroot/sys || fail "cannot move /sys"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o mode=0620,ptmxmode=0666 devpts /newroot/dev/pts || fail "cannot mount devpts"
mount -t tmpfs -o mode=1777,nosuid,nodev shm /newroot/dev/shm || fail "cannot mount /dev/shm"
exec switch_root /newroot /.corral/corral-vmagent --ctl "$ctl" --data "$data"
fail "switch_root failed"
"""


@dataclass(frozen=True, slots=True)
class Member:
    """One entry of the archive: a directory (``data`` None, no ``target``), a regular
    file, or a symlink (``target``)."""

    path: str  # without a leading "/"
    mode: int  # permission bits
    data: bytes | None = None
    target: str | None = None


def cpio_newc(members: Iterable[Member]) -> bytes:
    """A ``newc`` cpio archive (what the kernel unpacks), every entry root-owned, mtime 0
    (the same members make the same bytes)."""
    out = io.BytesIO()
    ino = 1
    for member in [*members, Member("TRAILER!!!", 0)]:
        if member.target is not None:
            body, kind = member.target.encode(), 0o120000
        elif member.data is not None:
            body, kind = member.data, 0o100000
        elif member.path == "TRAILER!!!":
            body, kind = b"", 0
        else:
            body, kind = b"", 0o040000
        name = member.path.encode() + b"\0"
        mode = kind | member.mode if kind else 0
        nlink = 2 if kind == 0o040000 else 1
        fields = (ino, mode, 0, 0, nlink, 0, len(body), 0, 0, 0, 0, len(name), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        out.write(header + name)
        out.write(b"\0" * (-(len(header) + len(name)) % 4))
        out.write(body)
        out.write(b"\0" * (-len(body) % 4))
        ino += 1
    return out.getvalue()


def gzip_cpio(members: Iterable[Member]) -> bytes:
    return gzip.compress(cpio_newc(members), compresslevel=6, mtime=0)


def module_order(modules_dir: Path, wanted: Iterable[str]) -> list[str]:
    """The modules ``wanted`` (names) and their dependencies, dependencies first, as paths
    relative to ``modules_dir``; modules the kernel has built in are left out. Raises
    ``LookupError`` for a module the kernel has neither built in nor as a file."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        if ":" not in line:
            continue
        path, rest = line.split(":", 1)
        deps[_module_name(path)] = (path, [_module_name(d) for d in rest.split()])
    builtin_file = modules_dir / "modules.builtin"
    builtin = (
        {_module_name(p) for p in builtin_file.read_text().split()}
        if builtin_file.exists()
        else set()
    )
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name not in deps:
            if name in builtin:
                return
            raise LookupError(f"kernel module {name} not found in {modules_dir}")
        path, needs = deps[name]
        # modules.dep lists a module's dependencies in the order they are to be unloaded
        for need in reversed(needs):
            visit(need)
        order.append(path)

    for name in wanted:
        visit(name.replace("-", "_"))
    return order


def _module_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    for suffix in (".ko", ".ko.xz", ".ko.zst", ".ko.gz"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")
