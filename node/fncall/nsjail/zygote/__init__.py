"""The zygote: PID 1 of one jail, and the template it forks every call's processes from.

The jail runs it as one script: ``source()`` (``assembly``) joins this package's modules,
in the order of ``assembly.MODULES``, and the host hands that text to the jail's own
interpreter (``/usr/bin/python3 -I -c SOURCE [--cpu-fd N]``, Debian's 3.11). The modules
therefore use the standard library only, stay compatible with Python 3.11, and share one
namespace once joined: no two define the same name, and each imports from the others
only names they define (underscored ones included: they are the zygote's internals, not
the host's API). Each module also imports on its own, for its unit tests and mypy; the
host itself imports only ``assembly``. ``N`` is a read-only descriptor of the jail
cgroup's CPU counter (v1 ``cpuacct.usage``), passed by the host; PID 1 reads it at the
start and end of each stage and nobody else holds it.

The modules, in the order they are joined:

* ``common``      the jail's paths, the spare's descriptors and environment
* ``framing``     ``Channel``: the framed JSON messages with the host
* ``startup``     PID 1's start-up; signal dispositions; a process's mapped size
* ``staging``     a call's files, sources and stdin written into the work dir
* ``fetch``       files fetched back after the call, within a budget
* ``pythonrun``   the Python runner: user code as ``__main__`` of a spare's interpreter
* ``child``       the stage's process: session, descriptors, rlimits, then run or exec
* ``siblingfork`` ``clone(CLONE_PARENT)``: a spare forked as PID 1's child directly
* ``template``    the template process and the spares it forks
* ``handles``     PID 1's handles on the template (``Template``) and a spare (``Spare``)
* ``capture``     bounded capture of a stage's output
* ``accounting``  the jail's processes from /proc, CPU time, run-queue wait
* ``cleanup``     kill-all, the wipe of a directory, SysV IPC removal
* ``stage``       ``run_stage``: one stage from hand-over to report
* ``main``        ``handle`` (one request) and ``main`` (PID 1's loop)

Three kinds of process run this code in a jail:

* **PID 1** speaks the protocol with the host, writes each call's files, hands each stage
  to a spare, captures its output, enforces its deadlines, kills and reaps everything the
  stage left, and wipes the jail after the call. It reads every request, so its memory
  holds earlier calls' code, input and output: nothing is ever forked from it after
  start-up.
* The **template** is forked by PID 1 at start-up, before any request is read, and
  never receives a byte of one. On PID 1's request it forks a spare as PID 1's child
  (``clone(CLONE_PARENT)``, see ``SiblingFork``; where that is not available, through a
  courier process that exits at once), so PID 1 waits for it, ``getppid()`` is 1, and the
  template never learns anything of a call, not even its exit status. Every call
  therefore starts from the same pristine image: the interpreter and the pre-imported
  modules.
* A **spare** holds the child's ends of its pipes and blocks until PID 1 writes its
  stage to it; then it sets itself up (session, descriptors, rlimits) and runs the
  Python code in its already-initialised interpreter, or execs the toolchain.

Protocol, over PID 1's stdin/stdout (moved to private descriptors at start-up): every
message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON.

    zygote -> host  {"op": "ready", "python": "3.11.2", "pid": 1, "vm_bytes": N}
    host -> zygote  {"op": "run", "id": ..., "sources": {...}, "files": {...}, "stdin": "...",
                     "stages": [...], "fetch": [...], "max_output": N, "max_fetch": N}
    zygote -> host  {"op": "stage", "id": ..., "index": 1}   before each stage after the first
    host -> zygote  {"op": "go", "id": ...}                 (after moving the cgroup limits)
    zygote -> host  {"op": "result", "id": ..., "stages": [...], "files": {...}, ...}
    zygote -> host  {"op": "clean", "id": ..., "ok": true}   (jail wiped, next spare ready)

End of input makes the zygote exit. Being PID 1 of the jail's PID namespace, it cannot be
killed by the code it runs (the kernel drops signals to a namespace init that has no
handler) and it adopts every orphan. The template can be killed by the code (same uid);
PID 1 notices (after each call the template must answer it, through a fork or a ping: a
SIGKILL not yet delivered leaves the process alive, but it cannot answer) and reports the
clean-up as failed, and the host replaces the jail.

The status pipe (fd 3 of a spare) reports a failure to start a stage (``X``). It is
close-on-exec, and the Python path closes it before the code runs: user code never holds
it, so nothing it writes can turn into a platform error.
"""

from node.fncall.nsjail.zygote.assembly import MODULES, AssemblyError, source

__all__ = ["MODULES", "AssemblyError", "source"]
