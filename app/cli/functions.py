"""Code and tool functions (tenant): ``run`` (one program, once) and ``functions``
(deploy a directory's function, list, invoke), through the SDK."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from app.cli.root import client, echo_json, key_option, url_option


@click.command()
@click.option("-l", "--language", required=True, help="python, bash, cpp, nodejs, ...")
@click.option("-c", "--code", default=None, help="The source, instead of FILE.")
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
@click.option(
    "--stdin",
    "stdin_file",
    type=click.File("r"),
    default=None,
    help="File whose content is the program's standard input ('-' for ours).",
)
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Run timeout, s.")
@click.option("--memory", type=int, default=None, help="Memory limit, MB.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
@url_option
@key_option
def run(
    language: str,
    code: str | None,
    file: Path | None,
    stdin_file: Any,
    timeout: float,
    memory: int | None,
    as_json: bool,
    url: str,
    api_key: str | None,
) -> None:
    """Send code to a Corral server, run it once and print its output.

    Exits with the program's exit code; 1 if it did not finish (a timeout, a memory
    limit) or the server refused the request (a key, a quota: the error is printed); 2 if
    the platform failed the run, or the command line is wrong.
    """
    if (code is None) == (file is None):
        raise click.UsageError("give exactly one of -c CODE or FILE")
    source = code if code is not None else file.read_text()  # type: ignore[union-attr]
    stdin = stdin_file.read() if stdin_file is not None else None
    with client(url, api_key) as sdk:
        result = sdk.run(language, source, stdin=stdin, run_timeout=timeout, memory_limit_mb=memory)
    if as_json:
        echo_json(result)
    else:
        for stage in ("compile", "run"):
            part = result.get(stage) or {}
            if part.get("stdout"):
                sys.stdout.write(part["stdout"])
            if part.get("stderr"):
                sys.stderr.write(part["stderr"])
            if part and part.get("status") != "finished":
                click.echo(
                    f"[{stage}: {part.get('status')}: {part.get('message') or ''}]", err=True
                )
        if result.get("error"):
            click.echo(f"[error: {result['error']}]", err=True)
    if result["status"] == "errored":
        sys.exit(2)
    last: dict[str, Any] = result.get("run") or result.get("compile") or {}
    if last.get("status") == "finished" and isinstance(last.get("exit_code"), int):
        sys.exit(last["exit_code"])
    sys.exit(1)


@click.group()
def functions() -> None:
    """Register and invoke tool functions (tenant)."""


def _manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a function directory: function.json or corral.toml."""
    json_file, toml_file = directory / "function.json", directory / "corral.toml"
    if json_file.is_file():
        data = json.loads(json_file.read_text())
    elif toml_file.is_file():
        import tomllib

        data = tomllib.loads(toml_file.read_text())
    else:
        raise click.UsageError(f"{directory} has no function.json or corral.toml")
    if not isinstance(data, dict) or "name" not in data or "source" not in data:
        raise click.UsageError("the manifest needs at least 'name' and 'source'")
    return data


def _build_module(directory: Path, manifest: dict[str, Any], module: Path) -> None:
    """Compile ``c_source`` to ``module`` with clang for wasm32-wasi."""
    import shutil
    import subprocess

    c_source = manifest.get("c_source")
    if not c_source:
        raise click.UsageError(f"{module} is missing and the manifest names no c_source")
    clang = shutil.which("clang")
    if clang is None:
        raise click.ClickException("clang is needed to build the module (scripts/setup-wasm.sh)")
    command = [clang, "--target=wasm32-wasi", "-O2", "-o", str(module), str(directory / c_source)]
    click.echo(" ".join(command), err=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise click.ClickException(f"clang failed:\n{done.stderr}")


@functions.command("deploy")
@click.argument(
    "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), default="."
)
@url_option
@key_option
def functions_deploy(directory: Path, url: str, api_key: str | None) -> None:
    """Register the function in DIRECTORY (its manifest and source) as a new version."""
    manifest = _manifest(directory)
    source = directory / str(manifest["source"])
    rest: dict[str, Any] = {
        k: manifest[k]
        for k in ("language", "entry_point", "input_schema", "limits")
        if k in manifest
    }
    code: str | None = None
    module: bytes | None = None
    if manifest.get("language") == "wasm":
        if not source.is_file():
            _build_module(directory, manifest, source)
        module = source.read_bytes()
    else:
        if not source.is_file():
            raise click.UsageError(f"{source} does not exist")
        code = source.read_text()
    with client(url, api_key) as sdk:
        result = sdk.functions.register(manifest["name"], code=code, module=module, manifest=rest)
    version = result["version"]
    state = "registered" if result["created"] else "unchanged, still"
    click.echo(
        f"{result['function']['name']}: {state} version {version['version']} "
        f"({version['language']}, sha256 {version['content_hash'][:12]})"
    )


@functions.command("list")
@url_option
@key_option
def functions_list(url: str, api_key: str | None) -> None:
    """List the tenant's functions."""
    with client(url, api_key) as sdk:
        echo_json(sdk.functions.list())


@functions.command("invoke")
@click.argument("name")
@click.option("--input", "input_text", default="{}", show_default=True, help="The input, as JSON.")
@click.option("--version", default=None, help="A version number or alias [latest].")
@url_option
@key_option
def functions_invoke(
    name: str, input_text: str, version: str | None, url: str, api_key: str | None
) -> None:
    """Invoke function NAME and print its result; exits 1 unless it succeeded."""
    try:
        value = json.loads(input_text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
    with client(url, api_key) as sdk:
        result = sdk.functions.invoke(name, value, version=version)
    echo_json(result)
    if result.get("status") != "succeeded":
        sys.exit(1)


COMMANDS: list[click.Command] = [run, functions]
