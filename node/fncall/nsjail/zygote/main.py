"""PID 1's life: greet the host, then for each request run its stages, answer, and clean
the jail for the next one (the protocol: the package's docstring)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from node.fncall.nsjail.zygote.accounting import _self_cpu_ms
from node.fncall.nsjail.zygote.cleanup import _kill_all, _remove_sysv_ipc, _wipe
from node.fncall.nsjail.zygote.common import WIPED
from node.fncall.nsjail.zygote.fetch import _fetch
from node.fncall.nsjail.zygote.framing import Channel
from node.fncall.nsjail.zygote.handles import Spare, Template, TemplateGone
from node.fncall.nsjail.zygote.stage import run_stage
from node.fncall.nsjail.zygote.staging import InputError, _prepare
from node.fncall.nsjail.zygote.startup import _setup, _vm_bytes


def handle(
    request: dict[str, Any],
    channel: Channel,
    template: Template,
    spare: Spare | None,
    cpu_fd: int | None = None,
) -> dict[str, Any]:
    cpu_since = _self_cpu_ms()
    result: dict[str, Any] = {"op": "result", "id": request.get("id"), "stages": []}
    try:
        _prepare(request)
    except InputError as exc:
        if spare is not None:
            spare.discard()
        result["input_error"] = str(exc)
        return result
    except OSError as exc:  # ENOSPC, "a" and "a/b" both given, names too long, ...
        if spare is not None:
            spare.discard()
        result["input_error"] = f"cannot write the input files: {exc.strerror}"
        return result
    leftover = 0
    for index, stage in enumerate(request["stages"]):
        if index:
            # let the host move the jail's cgroup limits to this stage's, then go on
            channel.send({"op": "stage", "id": request.get("id"), "index": index})
            go = channel.recv()
            if not go or go.get("op") != "go" or go.get("id") != request.get("id"):
                raise ValueError(f"expected 'go' for stage {index}, got {go!r}")
            cpu_since = _self_cpu_ms()
        report = run_stage(
            stage,
            index,
            int(request["max_output"]),
            template,
            spare,
            cpu_since=cpu_since,
            cpu_fd=cpu_fd,
        )
        spare = None
        leftover += report["leftover"]
        result["stages"].append(report)
        failed = report["error"] or report["start_failure"] or report["exit_code"] != 0
        if failed or report["timed_out"] or report["cpu_exceeded"]:
            break
    result["leftover"] = leftover
    files, notes = _fetch(list(request.get("fetch", [])), int(request.get("max_fetch", 0)))
    result["files"] = files
    result["fetch_notes"] = notes
    return result


def _arguments(argv: list[str]) -> int | None:
    """``--cpu-fd N``: the descriptor of the jail's cgroup CPU counter, if passed."""
    if "--cpu-fd" in argv:
        return int(argv[argv.index("--cpu-fd") + 1])
    return None


def main() -> None:
    cpu_fd = _arguments(sys.argv)
    channel = _setup()
    template = Template()  # before any request: the pristine image every call forks from
    spare: Spare | None = Spare(template)
    channel.send(
        {
            "op": "ready",
            "python": "{}.{}.{}".format(*sys.version_info[:3]),
            "pid": os.getpid(),
            "vm_bytes": _vm_bytes(),
        }
    )
    while True:
        request = channel.recv()
        if request is None:
            return
        if request.get("op") != "run":
            raise ValueError(f"unknown op {request.get('op')!r}")
        invocation = request.get("id")
        try:
            result = handle(request, channel, template, spare, cpu_fd)
        finally:
            spare = None
            del request
        channel.send(result)
        del result
        ok = True
        try:
            _kill_all(template.keep())
            for root in WIPED:
                os.chmod(root, 0o1777)  # the code may have locked us out of our own dirs
                _wipe(root)
            _remove_sysv_ipc()
            if not template.alive():
                raise TemplateGone("the template process is gone (killed by the code?)")
            if cpu_fd is None:
                # the host reads the cgroup around the next call's stages: fork its
                # process now, so that the fork's CPU time is nobody's (and a fork
                # through the template is answered only by a living one)
                spare = Spare(template)
            else:
                # a SIGKILL the code sent may not have been delivered yet (the template
                # not scheduled since, on a busy machine): ``alive`` can still say yes.
                # An answer can not: the signal is delivered before the template runs.
                template.check()
        except Exception as exc:
            sys.stderr.write(f"zygote: cleanup after {invocation} failed: {exc}\n")
            ok = False
        channel.send({"op": "clean", "id": invocation, "ok": ok})
        if not ok:
            return
        if spare is None:
            # while the host has nothing for us: off the next call's critical path (its
            # CPU time is measured from just before its stage starts); should this fail,
            # the next stage forks its own and reports why it could not
            with contextlib.suppress(TemplateGone, OSError):
                spare = Spare(template)


if __name__ == "__main__":
    main()
