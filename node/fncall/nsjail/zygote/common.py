"""What every part of the zygote shares: the jail's paths, the spare's descriptors and
environment, and the size of one read."""

from __future__ import annotations

BOX = "/box"
WORK = "/box/work"
STDIN_FILE = "/box/.stdin"
#: wiped after every call (``cleanup._wipe``)
WIPED = ("/tmp", "/dev/shm", BOX)
#: a spare's status pipe: fd 3 until the code runs (``child._child``)
STATUS_FD = 3
CHUNK = 65536
MAX_FD = 1 << 16
#: the environment of every call's code, set once by PID 1 (``startup._setup``)
CHILD_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}
