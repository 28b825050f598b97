"""``images``: the images sandboxes are created from. ``ls`` asks the server
(``GET /v1/images``, any tenant's key); ``ls --local``, ``build``, ``import`` and ``rm``
act on this machine's store (``images``) as its node reads it: no server involved.
``build --server`` and ``rm --server`` act on the tenant's own images instead (``POST``
and ``DELETE /v1/images``: built in a sandbox of the tenant's, through the SDK)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from pydantic import ValidationError

from app.cli.root import client, key_option, url_option

if TYPE_CHECKING:
    from images import Image, ImageStore, Progress


@click.group()
def images() -> None:
    """The images sandboxes are created from: list them (the server's); build, import,
    list (--local) and remove this machine's [CORRAL_IMAGES_DIR, default
    <CORRAL_DATA_DIR>/images]."""


def _image_store() -> ImageStore:
    from images import ImageStore
    from node.settings import NodeSettings

    try:
        settings = NodeSettings()
    except ValidationError as exc:
        raise click.UsageError("; ".join(e["msg"] for e in exc.errors())) from None
    return ImageStore(settings.resolved_images_dir)


def _progress() -> Progress:
    from images import Progress

    return Progress(lambda line: click.echo(line, err=True))


def _image_line(image: Image) -> str:
    import datetime

    created = datetime.datetime.fromtimestamp(image.created).strftime("%Y-%m-%d %H:%M")
    size = f"{image.size_bytes / 1e6:.1f} MB"
    return f"{image.name or '<none>':<24} {image.short_digest:<12} {size:>10}  {created}"


@images.command("build")
@click.argument("name")
@click.option(
    "-f",
    "--file",
    "dockerfile",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A Dockerfile to build (FROM a local image); without it, NAME's built-in recipe.",
)
@click.option(
    "--context",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="The build context of COPY [the Dockerfile's directory].",
)
@click.option(
    "--server",
    is_flag=True,
    help="Build one of the tenant's own images on the server (POST /v1/images, a "
    "tenant's key), in a sandbox; its log shown as it comes.",
)
@click.option(
    "--network",
    default=None,
    help='With --server: RUN\'s network, the JSON of {"allow": ["HOST[:PORT]", ...]} [none].',
)
@url_option
@key_option
def images_build(
    name: str,
    dockerfile: Path | None,
    context: Path | None,
    server: bool,
    network: str | None,
    url: str,
    api_key: str | None,
) -> None:
    """Build image NAME: from Debian's packages (a built-in recipe: python) or from a
    Dockerfile (-f) on top of a local image; with --server, the tenant's own image from
    a Dockerfile, built on the server FROM one of its images."""
    from images import RECIPES, ImageError

    if server:
        if dockerfile is None:
            raise click.UsageError("--server needs -f Dockerfile")
        with client(url, api_key) as sdk:
            built = sdk.images.build(
                name,
                dockerfile=dockerfile.read_text(),
                context=context or dockerfile.parent,
                network=network,
                on_log=_show,
            )
        click.echo(f"{built['name']} ({built['size_bytes'] / 1e6:.1f} MB, the tenant's)")
        return
    if network is not None:
        raise click.UsageError("--network needs --server")
    try:
        store = _image_store()
        if dockerfile is not None:
            from images import dockerfile as df

            image = df.build(
                store,
                name,
                dockerfile,
                context=context or dockerfile.parent,
                progress=_progress(),
            )
        else:
            if context is not None:
                raise click.UsageError("--context needs -f Dockerfile")
            if name not in RECIPES:
                raise click.UsageError(
                    f"no built-in recipe {name!r} (there are: {', '.join(sorted(RECIPES))}); "
                    "give -f Dockerfile to build anything else"
                )
            from images import debootstrap

            image = debootstrap.build(store, RECIPES[name], progress=_progress())
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{image.name} {image.digest}")


@images.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", required=True, help="The name to give the image.")
def images_import(file: Path, name: str) -> None:
    """Import FILE: an OCI image archive, a `docker save` tarball or a root filesystem
    tar (.tar, .tar.gz)."""
    from images import ImageError, importer

    try:
        image = importer.import_file(_image_store(), file, name=name, progress=_progress())
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{image.name} {image.digest}")


@images.command("ls")
@click.option(
    "--local", is_flag=True, help="This machine's store, not the server's list (no key needed)."
)
@url_option
@key_option
def images_ls(local: bool, url: str, api_key: str | None) -> None:
    """List the images: name, digest (short), size, created; the server's (a tenant's
    or the admin key), or with --local this machine's store."""
    click.echo(f"{'NAME':<24} {'DIGEST':<12} {'SIZE':>10}  CREATED")
    if not local:
        with client(url, api_key) as sdk:
            listed = sdk.images.list()["images"]
        for item in listed:
            click.echo(_row(item["name"], item["digest"], item["size_bytes"], item["created_at"]))
        return
    from images import ImageError

    try:
        found = _image_store().list()
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    for image in found:
        click.echo(_image_line(image))


def _row(name: str, digest: str | None, size_bytes: int, created: str) -> str:
    import datetime

    when = datetime.datetime.fromisoformat(created).astimezone().strftime("%Y-%m-%d %H:%M")
    short = digest.removeprefix("sha256:")[:12] if digest else "(tenant's)"
    return f"{name or '<none>':<24} {short:<12} {f'{size_bytes / 1e6:.1f} MB':>10}  {when}"


def _show(line: dict[str, object]) -> None:
    """A line of a server's build log, on stderr as it comes."""
    if "step" in line:
        click.echo(f"--> {line['step']}", err=True)
    elif "log" in line:
        click.echo(str(line["log"]), err=True, nl=False)


@images.command("rm")
@click.argument("ref")
@click.option("--server", is_flag=True, help="One of the tenant's own images, on the server.")
@url_option
@key_option
def images_rm(ref: str, server: bool, url: str, api_key: str | None) -> None:
    """Remove image REF: a name (the image goes with its last name) or a digest
    (sha256:..., a unique prefix will do; every name of it goes too); with --server, the
    tenant's own image REF and its snapshot."""
    from images import ImageError

    if server:
        with client(url, api_key) as sdk:
            sdk.images.delete(ref)
        click.echo(f"removed {ref}")
        return
    try:
        _image_store().remove(ref)
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"removed {ref}")


COMMANDS: list[click.Command] = [images]
