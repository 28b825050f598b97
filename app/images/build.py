"""A tenant's image, built from a Dockerfile through the API (``POST /v1/images``) inside
a sandbox of the tenant's: never as root on the host, never with the host's tools.

    client ──multipart: name, dockerfile, context (tar, plain or gzip)──▶ gateway
    checks, before the answer starts (4xx): the Dockerfile's plan (``images.steps``: the
      operator's subset and refusals), the name (free, no catalogue image's), FROM (a
      catalogue image or one of the tenant's own), room for a sandbox and a snapshot
    a build sandbox, created as any of the tenant's (its quotas; bounded time, CPU,
      memory, disk; the network asked for, none by default)
      ──upload──▶ /.corral-build/context.tar ──the sandbox's tar──▶ /.corral-build/context
      per step: COPY (cp in the sandbox, --chown by the image's own accounts), RUN (an
      exec with the build's ENV and ARGs, WORKDIR and USER, its output streamed as the
      log), WORKDIR made, USER checked, the rest recorded
      ──rm the context──▶ snapshot (``max_snapshots``, ``max_storage_mb``: its size is the
      image's, counted in the tenant's storage) ──▶ a ``tenant_images`` row
    the build sandbox is ended in every case; a client that goes cancels the build.

The log is NDJSON, one object a line (``app.schemas.images``): ``{"step": ...}`` as each
step begins, ``{"log": ...}`` as a RUN writes, and last ``{"image": {...}}`` or
``{"error": {"code": ..., "message": ...}}``. RUN runs as the Dockerfile's USER, which
starts as the FROM image's (``python``'s is ``user``: ``USER root`` for apt-get), and its
root is the sandbox's: an unprivileged id of the host in the sandbox's user namespace.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import BaseModel

from app.auth.principal import Principal
from app.db.models import TenantImage
from app.errors import (
    BuildFailed,
    Conflict,
    CorralError,
    InvalidDockerfile,
    ValidationFailed,
)
from app.images.catalog import TEMPLATE_IMAGES, ControlImages
from app.images.owned import OwnedImages, owned_info
from app.sandboxes.admission import Ask
from app.sandboxes.service import Sandboxes
from app.schemas.images import BuildDone, BuildError, BuildErrorBody, BuildLog, BuildStep
from app.schemas.sandboxes import CreateSandbox
from images import steps
from images.errors import ImageBuildError, ImageError
from images.instructions import Instruction
from images.store import check_name
from wire.ids import new_id
from wire.sandboxes import ExecExit, ExecOutput, ExecRequest, NetworkPolicy

log = logging.getLogger(__name__)

BUILD_DIR = "/.corral-build"
CONTEXT_TAR = f"{BUILD_DIR}/context.tar"
CONTEXT_DIR = f"{BUILD_DIR}/context"
#: the build sandbox's TTL past the build's own deadline (its last steps and teardown)
MARGIN_S = 60.0
#: the most of a RUN's output kept per stream (past it the node discards the rest)
MAX_RUN_OUTPUT = 4 << 20
#: the end of a failed step's output quoted in its error
ERROR_TAIL = 2000
#: a context archive's bytes are sent to the node in pieces of this size
CHUNK = 256 << 10

#: COPY inside the sandbox: $1 the context, $2 the target, $3 the owner ('' keeps root),
#: $4 1 if the target is a directory; then the source patterns. Each pattern must match,
#: and every match stay in the context once symlinks are resolved; a directory's contents
#: are copied, not the directory (``images.context``'s rules). Modes are the source's
#: (under umask 022: the sandbox's seccomp refuses the ACL calls ``cp`` preserves them
#: with); symlinks are copied as links.
_COPY = r"""set -eu
umask 022
ctx=$1 target=$2 owner=$3 into=$4
shift 4
cd "$ctx"
base=$(pwd -P)
IFS=''
for pattern in "$@"; do
  found=0
  for m in $pattern; do
    if [ -e "$m" ] || [ -L "$m" ]; then
      found=1
      real=$(realpath -m -- "$m")
      case $real in
        "$base"|"$base"/*) ;;
        *) echo "COPY source '$pattern' resolves outside the build context" >&2; exit 3 ;;
      esac
      if [ -d "$m" ]; then into=1; fi
    fi
  done
  if [ "$found" = 0 ]; then
    echo "COPY source '$pattern' matches nothing in the build context" >&2; exit 3
  fi
done
if [ "$into" = 1 ]; then mkdir -p -- "$target"; else mkdir -p -- "$(dirname -- "$target")"; fi
for pattern in "$@"; do
  for m in $pattern; do
    if [ -e "$m" ] || [ -L "$m" ]; then
      if [ -d "$m" ]; then
        cp -R -P --preserve=timestamps,links -- "$m"/. "$target"/
        if [ -n "$owner" ]; then
          for e in "$m"/* "$m"/.[!.]* "$m"/..?*; do
            if [ -e "$e" ] || [ -L "$e" ]; then chown -hR -- "$owner" "$target/${e##*/}"; fi
          done
        fi
      else
        if [ "$into" = 1 ]; then final=$target/${m##*/}; else final=$target; fi
        if [ -d "$final" ] && [ ! -L "$final" ]; then final=$final/${m##*/}; fi
        if [ -L "$final" ] || [ -e "$final" ]; then rm -f -- "$final"; fi
        cp -R -P --preserve=timestamps,links -- "$m" "$final"
        if [ -n "$owner" ]; then chown -h -- "$owner" "$final"; fi
      fi
    fi
  done
done
"""

#: USER: $1 NAME[:GROUP] must name an account (and group) of the image, or be numeric
_USER = r"""name=${1%%:*}
case $name in
  *[!0-9]*) id -u -- "$name" >/dev/null 2>&1 \
    || { echo "user '$name' does not exist in the image" >&2; exit 3; } ;;
esac
case $1 in
  *:*) group=${1#*:}
    case $group in
      *[!0-9]*) getent group -- "$group" >/dev/null \
        || { echo "group '$group' does not exist in the image" >&2; exit 3; } ;;
    esac ;;
esac
"""

#: the context archive unpacked (GNU tar reads plain and compressed archives alike)
_UNPACK = f"""set -eu
mkdir -p {CONTEXT_DIR}
if [ -f {CONTEXT_TAR} ]; then
  tar -xf {CONTEXT_TAR} -C {CONTEXT_DIR} --no-same-owner
  rm -f {CONTEXT_TAR}
fi
"""


@dataclass(frozen=True)
class BuildAsk:
    """What a client asks a build for (``POST /v1/images``)."""

    name: str
    dockerfile: str
    #: the context archive's bytes, read as they are sent to the node (None: no context)
    context: Callable[[], AsyncIterator[bytes]] | None = None
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    cpu: float = 1.0
    memory_mb: int = 1024
    disk_mb: int = 2048
    timeout_s: float = 1800.0


class Builds:
    """Tenants' builds: checked (``prepare``), then run as their log is read."""

    def __init__(self, *, sandboxes: Sandboxes, images: ControlImages, owned: OwnedImages) -> None:
        self.sandboxes = sandboxes
        self.owned = owned
        self._images = images
        #: build sandboxes being ended (a cancelled build cannot wait for its end)
        self._ends: set[asyncio.Task[object]] = set()

    async def close(self) -> None:
        if self._ends:
            await asyncio.wait(self._ends, timeout=10)

    async def prepare(self, principal: Principal, ask: BuildAsk) -> Build:
        """Everything a build can be refused for before it starts: a Dockerfile outside
        the subset or FROM an image the tenant cannot use (422 ``invalid_dockerfile``), a
        name taken (409) or invalid (422), no room for the build's sandbox or for one
        more snapshot (429, the quota's code)."""
        try:
            check_name(ask.name)
        except ImageError as exc:
            raise ValidationFailed(str(exc)) from None
        if ask.name in TEMPLATE_IMAGES or await self._images.find(ask.name) is not None:
            raise Conflict(f"{ask.name!r} names a catalogue image: choose another name")
        if await self.owned.find(principal.tenant_id, ask.name) is not None:
            raise Conflict(
                f"the tenant already has an image named {ask.name!r}: delete it first "
                f"(DELETE /v1/images/{ask.name})"
            )
        try:
            plan = steps.plan(ask.dockerfile)
        except ImageBuildError as exc:
            raise InvalidDockerfile(str(exc)) from None
        state = plan.state()
        await self._base(principal, plan, state)
        lifetime_s = float(principal.quota.max_sandbox_lifetime_seconds)
        ttl_s = min(ask.timeout_s + MARGIN_S, lifetime_s)
        await self.sandboxes.precheck(
            principal, Ask(cpu=ask.cpu, memory_mb=ask.memory_mb, disk_mb=ask.disk_mb)
        )
        await self.sandboxes.snapshots.precheck(principal)
        return Build(
            builds=self,
            principal=principal,
            ask=ask,
            plan=plan,
            state=state,
            ttl_s=ttl_s,
            deadline=time.monotonic() + max(ttl_s - MARGIN_S, min(ttl_s, 60.0)),
        )

    async def _base(self, principal: Principal, plan: steps.Plan, state: steps.BuildState) -> None:
        """The FROM image: a catalogue image, or one of the tenant's own; its config is
        the build's start."""
        if plan.base is None:
            raise InvalidDockerfile(
                str(plan.origin.error("a tenant's build starts FROM an image, not scratch"))
            )
        catalogued = await self._images.find(plan.base)
        if catalogued is not None:
            state.inherit(
                env=catalogued.env,
                user=catalogued.user,
                workdir=catalogued.workdir,
                cmd=catalogued.cmd,
                entrypoint=catalogued.entrypoint,
            )
            return
        owned = await self.owned.find(principal.tenant_id, plan.base)
        if owned is None:
            refusal = plan.origin.error(
                f"no image {plan.base!r}: FROM names a catalogue image or one of the "
                "tenant's own (GET /v1/images)"
            )
            raise InvalidDockerfile(str(refusal))
        command = owned.command or {}
        state.inherit(
            env=owned.env,
            user=owned.user,
            workdir=owned.workdir,
            cmd=_argv(command.get("cmd")),
            entrypoint=_argv(command.get("entrypoint")),
        )

    def end(self, principal: Principal, sandbox_id: str) -> None:
        """End a build sandbox, off the caller's path (a cancelled build cannot await)."""

        async def destroy() -> None:
            try:
                await self.sandboxes.destroy(principal.tenant_id, sandbox_id)
            except Exception as exc:  # the sandbox's TTL ends it anyway
                log.warning("sandbox=%s: the build's sandbox was not ended: %r", sandbox_id, exc)

        task: asyncio.Task[object] = asyncio.ensure_future(destroy())
        self._ends.add(task)
        task.add_done_callback(self._ends.discard)

    async def delete(self, principal: Principal, name: str) -> None:
        """Delete one of the tenant's images and its snapshot: refused (409) while a
        sandbox made from it lives or another image is built on it."""
        image = await self.owned.get(principal.tenant_id, name)
        await self.sandboxes.snapshots.delete(principal.tenant_id, image.snapshot_id, image=True)
        await self.owned.forget(image.id)
        log.info("tenant=%s: image %r deleted", principal.tenant_id, name)


@dataclass
class Build:
    """One build, checked; ``log()`` runs it."""

    builds: Builds
    principal: Principal
    ask: BuildAsk
    plan: steps.Plan
    state: steps.BuildState
    ttl_s: float
    deadline: float

    async def log(self) -> AsyncGenerator[BaseModel]:
        """Run the build, its log as it goes; the last line says how it ended."""
        sandboxes = self.builds.sandboxes
        sandbox_id: str | None = None
        try:
            yield BuildStep(step=f"FROM {self.plan.base}: starting the build's sandbox", line=1)
            row = await sandboxes.create(
                self.principal,
                CreateSandbox(
                    image=self.plan.base or "",
                    cpu=self.ask.cpu,
                    memory_mb=self.ask.memory_mb,
                    disk_mb=self.ask.disk_mb,
                    ttl_s=self.ttl_s,
                    network=self.ask.network,
                    user="root",
                    metadata={"corral.build": self.ask.name},
                ),
            )
            sandbox_id = row.id
            yield BuildStep(step=f"sandbox {sandbox_id}: unpacking the context")
            await self._context(sandbox_id)
            for instruction in self.plan.steps:
                yield BuildStep(
                    step=f"line {instruction.line}: {instruction.keyword} {instruction.args[:200]}",
                    line=instruction.line,
                )
                async for line in self._apply(sandbox_id, instruction):
                    yield line
            yield BuildStep(step="removing the context; taking the snapshot")
            await self._script(sandbox_id, "cleanup", f"rm -rf {BUILD_DIR}", [])
            image = await self._keep(sandbox_id)
            yield BuildDone(image=owned_info(image))
        except CorralError as exc:
            log.info("build %r tenant=%s: %s", self.ask.name, self.principal.tenant_id, exc)
            yield BuildError(error=BuildErrorBody(code=exc.code, message=exc.message))
        except Exception:
            log.exception("build %r tenant=%s failed", self.ask.name, self.principal.tenant_id)
            yield BuildError(error=BuildErrorBody(code="internal_error", message="internal error"))
        finally:
            if sandbox_id is not None:
                self.builds.end(self.principal, sandbox_id)

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise BuildFailed(f"the build passed its {self.ask.timeout_s:g} s")
        return left

    async def _context(self, sandbox_id: str) -> None:
        await self._script(sandbox_id, "the context", f"mkdir -p -m 0700 {BUILD_DIR}", [])
        if self.ask.context is not None:
            node = await self.builds.sandboxes.node_for(self.principal.tenant_id, sandbox_id)
            await node.write_file(
                sandbox_id, CONTEXT_TAR, self.ask.context(), user="root", mode=0o600
            )
        await self._script(sandbox_id, "the context", _UNPACK, [])

    async def _apply(self, sandbox_id: str, instruction: Instruction) -> AsyncIterator[BuildLog]:
        state = self.state
        keyword = instruction.keyword
        what = f"Dockerfile line {instruction.line}: {keyword}"
        try:
            if keyword in steps.IGNORED:
                yield BuildLog(log=f"{keyword} ignored (not used by Corral)\n")
            elif keyword == "RUN":
                argv = steps.command(instruction)
                async for line in self._exec(
                    sandbox_id, argv, what=f"{what} failed", user=state.user, cwd=state.workdir
                ):
                    yield line
            elif keyword == "COPY":
                copy = steps.copy_of(instruction, state)
                owner = copy.chown or ""
                if owner and ":" not in owner:
                    owner += ":"  # the user's own group
                into = "1" if copy.into_dir(any_dir=False) else "0"
                args = [CONTEXT_DIR, copy.target(state.workdir), owner, into, *copy.sources]
                await self._script(sandbox_id, what, _COPY, args)
            elif steps.configure(instruction, state):
                if keyword == "WORKDIR":
                    await self._script(sandbox_id, what, 'mkdir -p -- "$1"', [state.workdir])
                elif keyword == "USER" and not steps.is_root(state.user):
                    await self._script(sandbox_id, what, _USER, [state.user])
            else:  # steps.plan refused it already
                raise instruction.error("this instruction is not supported")
        except ImageBuildError as exc:
            raise BuildFailed(str(exc)) from None

    async def _script(self, sandbox_id: str, what: str, script: str, args: list[str]) -> None:
        """A step's own work, as the sandbox's root; its complaint is the error."""
        argv = ["/bin/sh", "-c", script, "build", *args]
        try:
            async for _ in self._exec(sandbox_id, argv, what=what, user="root", cwd="/"):
                pass
        except _Complaint as exc:
            raise BuildFailed(f"{what}: {exc.tail}" if exc.tail else exc.message) from None

    async def _exec(
        self, sandbox_id: str, argv: list[str], *, what: str, user: str, cwd: str
    ) -> AsyncIterator[BuildLog]:
        """Run ``argv``; its output as log lines (whole characters), ``BuildFailed``
        with the output's end unless it exits 0."""
        request = ExecRequest(
            cmd=argv,
            env=self.state.variables(),
            cwd=cwd,
            user=user,
            timeout_s=self._left(),
            max_output_bytes=MAX_RUN_OUTPUT,
        )
        events = await self.builds.sandboxes.exec(self.principal, sandbox_id, request)
        decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in _STREAMS}
        tail = ""
        done: ExecExit | None = None
        async for event in events:
            if isinstance(event, ExecOutput):
                text = decoders[event.stream].decode(event.data)
                if text:
                    tail = (tail + text)[-ERROR_TAIL:]
                    yield BuildLog(log=text, stream=event.stream)
            elif isinstance(event, ExecExit):
                done = event
        for stream, decoder in decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                tail = (tail + rest)[-ERROR_TAIL:]
                yield BuildLog(log=rest, stream=stream)
        if done is None or done.exit_code != 0:
            raise _Complaint(_failure(what, done, tail), tail.strip())

    async def _keep(self, sandbox_id: str) -> TenantImage:
        """Snapshot the sandbox and record the image (its snapshot deleted if the name
        was taken meanwhile)."""
        sandboxes = self.builds.sandboxes
        snapshot = await sandboxes.snapshot(self.principal, sandbox_id)
        state = self.state
        image = TenantImage(
            id=new_id("img"),
            tenant_id=self.principal.tenant_id,
            name=self.ask.name,
            snapshot_id=snapshot.id,
            parent=self.plan.base or "",
            env=dict(state.env),
            user=state.user,
            workdir=state.workdir,
            command={
                "cmd": list(state.cmd) if state.cmd is not None else None,
                "entrypoint": list(state.entrypoint) if state.entrypoint is not None else None,
            },
            size_bytes=snapshot.size_bytes,
            created_at=datetime.now(UTC),
        )
        try:
            await self.builds.owned.add(image)
        except BaseException:
            gone = sandboxes.delete_snapshot(self.principal.tenant_id, snapshot.id)
            await asyncio.shield(_quietly(gone))
            raise
        log.info(
            "tenant=%s: image %r built (%s, %d bytes)",
            image.tenant_id,
            image.name,
            snapshot.id,
            image.size_bytes,
        )
        return image


_STREAMS = ("stdout", "stderr")


class _Complaint(BuildFailed):
    """A command of the build failed; ``tail``: the end of what it wrote."""

    def __init__(self, message: str, tail: str) -> None:
        super().__init__(message)
        self.tail = tail


def _failure(what: str, done: ExecExit | None, tail: str) -> str:
    if done is None:
        why = "the command's end was not reported"
    elif done.error:
        why = done.error
    elif done.timed_out:
        why = "the build's time ran out"
    elif done.exit_code is None:
        why = f"killed by signal {done.signal}"
    else:
        why = f"exit {done.exit_code}"
    message = f"{what} ({why})"
    return f"{message}: {tail.strip()}" if tail.strip() else message


def _argv(value: object) -> tuple[str, ...] | None:
    return tuple(str(v) for v in value) if isinstance(value, list) else None


async def _quietly(work: Awaitable[None]) -> None:
    try:
        await work
    except Exception as exc:
        log.warning("a build's snapshot was left: %r", exc)
