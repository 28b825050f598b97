"""``sandbox``: stateful sandboxes (tenant), through the SDK: create, exec (its output
streamed), cp one file in or out, ls, pause, resume, rm."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import posixpath
import re
import stat
import sys
from pathlib import Path
from typing import Any

import click

from app.cli.root import client, echo_json, key_option, pairs, url_option
from corral import Conflict, Corral, Files, NotFound, SandboxInfo

#: ``ID:/path`` names a path in a sandbox (``ID:`` alone is its root); anything else is local
_REMOTE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]*):(.*)$")
#: the exit status of ``corral sandbox exec`` when the command has none (as timeout(1), sh;
#: a program that is not found exits 127 by itself, from the sandbox's init)
EXIT_TIMED_OUT, EXIT_NOT_STARTED = 124, 126


@click.group()
def sandbox() -> None:
    """Stateful sandboxes (tenant): files and processes stay between commands."""


def _info_dict(info: SandboxInfo) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        json.dumps(dataclasses.asdict(info), default=lambda v: v.isoformat())
    )
    return data


def _remote(arg: str) -> tuple[str, str] | None:
    match = _REMOTE.match(arg)
    return (match[1], match[2] or "/") if match else None


def _pairs_option(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> Any:
    return pairs(items, f"--{param.opts[0].lstrip('-')}") if items else None


@sandbox.command("create")
@click.option("--image", default="python", show_default=True, help="An image of the node.")
@click.option("--backend", default=None, help="crun (containers) [the server's default].")
@click.option("--cpu", type=float, default=None, help="Cores (a quota) [1].")
@click.option("--memory-mb", type=int, default=None, help="Memory limit, MiB [512].")
@click.option("--disk-mb", type=int, default=None, help="Size of the writable layer, MiB [1024].")
@click.option("--ttl", "ttl_s", type=float, default=None, help="Lifetime, s [300].")
@click.option("--idle-timeout", "idle_timeout_s", type=float, default=None, help="Idle limit, s.")
@click.option(
    "--env",
    multiple=True,
    metavar="K=V",
    callback=_pairs_option,
    help="An environment variable (repeatable).",
)
@click.option(
    "--meta",
    "metadata",
    multiple=True,
    metavar="K=V",
    callback=_pairs_option,
    help="A metadata label (repeatable).",
)
@click.option(
    "--allow",
    "network",
    multiple=True,
    metavar="HOST[:PORT]",
    callback=lambda ctx, param, items: list(items) if items else None,
    help="A destination it may reach (repeatable; 0.0.0.0/0 is the internet). "
    "None given: no network.",
)
@click.option("--user", default=None, help="Commands run as [user].")
@click.option("--json", "as_json", is_flag=True, help="Print the whole record as JSON.")
@url_option
@key_option
def sandbox_create(as_json: bool, url: str, api_key: str | None, **create: Any) -> None:
    """Create a sandbox and print its id."""
    # every other option is named as a parameter of the SDK's ``sandboxes.create`` and
    # passed on as it is (what is not given takes the server's default)
    with client(url, api_key) as sdk:
        sbx = sdk.sandboxes.create(**create)
    if as_json:
        echo_json(_info_dict(sbx.info))
    else:
        click.echo(sbx.id)


def _write_out(data: str) -> None:
    sys.stdout.write(data)
    sys.stdout.flush()


def _write_err(data: str) -> None:
    sys.stderr.write(data)
    sys.stderr.flush()


@sandbox.command("exec")
@click.argument("sandbox_id")
@click.argument("cmd", nargs=-1, required=True)
@click.option("--env", multiple=True, metavar="K=V", help="An environment variable (repeatable).")
@click.option("--cwd", default=None, help="Working directory [the user's home].")
@click.option("--user", default=None, help="root, user, a uid or uid:gid [the sandbox's].")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds.")
@click.option("--shell", is_flag=True, help="Run CMD as one /bin/sh -c line.")
@click.option(
    "--stdin", "stdin_file", type=click.File("r"), default=None, help="Input file ('-': ours)."
)
@url_option
@key_option
def sandbox_exec(
    sandbox_id: str,
    cmd: tuple[str, ...],
    env: tuple[str, ...],
    cwd: str | None,
    user: str | None,
    timeout: float,
    shell: bool,
    stdin_file: Any,
    url: str,
    api_key: str | None,
) -> None:
    """Run CMD in sandbox ID, its output streamed here as it comes; put CMD after --
    when it has options of its own: corral sandbox exec ID -- python3 -c 'print(1)'.

    Exits with the command's exit code; 128+N if signal N killed it, 124 if it timed out,
    127 if the program was not found, 126 if the platform could not start it. CMD is not
    run through a shell: pass --shell for pipes, variables and &&.
    """
    with client(url, api_key) as sdk:
        sbx = sdk.sandboxes.get(sandbox_id)
        result = sbx.exec(
            " ".join(cmd) if shell else list(cmd),
            env=pairs(env, "--env"),
            cwd=cwd,
            user=user,
            stdin=stdin_file.read() if stdin_file is not None else None,
            timeout_s=timeout,
            on_stdout=_write_out,
            on_stderr=_write_err,
        )
    if result.error:
        click.echo(f"[error: {result.error}]", err=True)
        sys.exit(EXIT_NOT_STARTED)
    if result.timed_out:
        click.echo(f"[timed out after {timeout:g} s]", err=True)
        sys.exit(EXIT_TIMED_OUT)
    if result.exit_code is None:
        sys.exit(128 + (result.signal or 0))
    sys.exit(result.exit_code)


@sandbox.command("cp")
@click.argument("src")
@click.argument("dst")
@url_option
@key_option
def sandbox_cp(src: str, dst: str, url: str, api_key: str | None) -> None:
    """Copy one file into or out of a sandbox: one side is ID:/path, the other a local
    path ('-': standard input or output). A directory ending in / takes the file's name."""
    source, target = _remote(src), _remote(dst)
    if (source is None) == (target is None):
        raise click.UsageError("one of SRC and DST is ID:/path, the other a local path")
    with client(url, api_key) as sdk:
        if target is not None:
            _upload(sdk, src, *target)
        else:
            assert source is not None
            _download(sdk, *source, dst)


def _upload(sdk: Corral, local: str, sandbox_id: str, path: str) -> None:
    """Stream one local file (or standard input) into the sandbox, never read whole."""
    files = sdk.sandboxes.get(sandbox_id).files
    if local == "-":
        files.write(path, sys.stdin.buffer)
        return
    file = Path(local)
    if file.is_dir():
        raise click.ClickException(
            f"{local} is a directory: cp copies one file (send a tar archive, then "
            f"`corral sandbox exec {sandbox_id} -- tar -xf ...`)"
        )
    if path.endswith("/") or _is_dir(files, path):
        path = posixpath.join(path, file.name)
    try:
        opened = file.open("rb")
    except OSError as exc:
        raise click.ClickException(f"cannot read {local}: {exc.strerror}") from None
    with opened:
        mode = stat.S_IMODE(os.fstat(opened.fileno()).st_mode)
        files.write(path, opened, mode=mode)


def _is_dir(files: Files, path: str) -> bool:
    try:
        return files.stat(path).is_dir
    except NotFound:
        return False


def _download(sdk: Corral, sandbox_id: str, path: str, local: str) -> None:
    """Stream one file out of the sandbox: into a partial file renamed once whole (an
    interrupted copy leaves no half file under the target's name)."""
    files = sdk.sandboxes.get(sandbox_id).files
    if files.stat(path).is_dir:
        raise click.ClickException(f"{sandbox_id}:{path} is a directory: cp copies one file")
    if local == "-":
        files.read_into(path, sys.stdout.buffer)
        sys.stdout.flush()
        return
    target = Path(local)
    if target.is_dir():
        target = target / posixpath.basename(path.rstrip("/"))
    partial = target.with_name(f".{target.name}.corral-partial")
    try:
        with partial.open("wb") as out:
            files.read_into(path, out)
        partial.replace(target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {target}: {exc.strerror}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


@sandbox.command("ls")
@click.argument("where", required=False)
@click.option("--state", default="live", show_default=True, help="live, or one state.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@url_option
@key_option
def sandbox_ls(where: str | None, state: str, as_json: bool, url: str, api_key: str | None) -> None:
    """Without WHERE, the tenant's sandboxes; with ID:/path (or ID), that directory."""
    with client(url, api_key) as sdk:
        if where is None:
            found = sdk.sandboxes.list(state)
            if as_json:
                echo_json([_info_dict(s.info) for s in found])
                return
            click.echo(f"{'ID':<32} {'STATE':<9} {'IMAGE':<16} {'CREATED':<20} EXPIRES")
            for s in found:
                click.echo(
                    f"{s.id:<32} {s.state:<9} {s.info.image:<16} "
                    f"{_when(s.info.created_at):<20} {_when(s.info.expires_at)}"
                )
            return
        sandbox_id, path = _remote(where) or (where, "/")
        entries = sdk.sandboxes.get(sandbox_id).files.list(path)
    if as_json:
        echo_json([dataclasses.asdict(e) for e in entries])
        return
    for e in entries:
        name = e.name + ("/" if e.is_dir else "")
        click.echo(
            f"{stat.filemode(_KINDS.get(e.type, 0) | e.mode)} {e.owner:>6} {e.size:>10} {name}"
        )


_KINDS = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}


def _when(moment: datetime.datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


@sandbox.command("rm")
@click.argument("sandbox_ids", nargs=-1, required=True, metavar="ID...")
@url_option
@key_option
def sandbox_rm(sandbox_ids: tuple[str, ...], url: str, api_key: str | None) -> None:
    """Destroy sandboxes (their files and processes); prints each id destroyed."""
    failed = 0
    with client(url, api_key) as sdk:
        for sandbox_id in sandbox_ids:
            try:
                sdk.sandboxes.get(sandbox_id).kill()
            except (NotFound, Conflict) as exc:
                click.echo(f"Error: {sandbox_id}: {exc}", err=True)
                failed += 1
            else:
                click.echo(sandbox_id)
    if failed:
        sys.exit(1)


def _sandbox_action(name: str, summary: str) -> click.Command:
    @click.argument("sandbox_id")
    @url_option
    @key_option
    def command(sandbox_id: str, url: str, api_key: str | None) -> None:
        with client(url, api_key) as sdk:
            sbx = sdk.sandboxes.get(sandbox_id)
            getattr(sbx, name)()
        click.echo(f"{sbx.id} {sbx.state}")

    command.__doc__ = summary
    return sandbox.command(name)(command)


sandbox_pause = _sandbox_action("pause", "Freeze every process of sandbox ID.")
sandbox_resume = _sandbox_action("resume", "Thaw paused sandbox ID.")


COMMANDS: list[click.Command] = [sandbox]
