"""``/v1/images``: the images a sandbox can be created from: the catalogue (the control
plane's store, shared by every tenant) and the tenant's own, built here from a Dockerfile
(``POST``: ``app.images.build``, its log streamed) and deleted here; nobody else sees a
tenant's images."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from app.auth.principal import Principal
from app.errors import ImageNotFound, PayloadTooLarge, UnsupportedMediaType, ValidationFailed
from app.http.endpoint import Call, endpoint
from app.images.build import CHUNK, BuildAsk
from app.images.catalog import TEMPLATE_IMAGES
from app.images.owned import owned_info
from app.sandboxes import output
from app.schemas.images import ImageInfo, ImageList
from images.store import Image
from wire.sandboxes import NetworkPolicy

TAGS = ["sandboxes"]
#: the most a Dockerfile may hold
MAX_DOCKERFILE_BYTES = 1 << 20

BUILD_FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "the image's name (the tenant's own)"},
        "dockerfile": {
            "type": "string",
            "description": "the Dockerfile's text (a field or a file; at most 1 MiB)",
        },
        "context": {
            "type": "string",
            "format": "binary",
            "description": "the build context: a tar archive, plain or gzip (COPY's sources)",
        },
        "network": {
            "type": "string",
            "description": 'RUN steps\' network: "none" (the default) or the JSON of a '
            'sandbox\'s {"allow": ["HOST[:PORT]", ...]}',
        },
        "cpu": {"type": "number", "description": "the build sandbox's cores (default 1)"},
        "memory_mb": {"type": "integer", "description": "its memory (default 1024)"},
        "disk_mb": {"type": "integer", "description": "its writable layer (default 2048)"},
        "timeout_s": {"type": "number", "description": "the build's time (default 1800)"},
    },
    "required": ["name", "dockerfile"],
}


class _BuildFields(BaseModel):
    """The form's fields other than the Dockerfile and the context, checked."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    cpu: float = Field(1.0, gt=0, le=64)
    memory_mb: int = Field(1024, ge=64, le=262_144)
    disk_mb: int = Field(2048, ge=64, le=1_048_576)
    timeout_s: float = Field(1800.0, gt=0, le=86400)


def _info(image: Image) -> ImageInfo:
    return ImageInfo(
        name=image.name,
        digest=image.digest,
        size_bytes=image.size_bytes,
        created_at=datetime.fromtimestamp(image.created, UTC),
        source=image.source,
        user=image.user,
        workdir=image.workdir,
        packages=list(image.packages),
        templates=sorted(t for t, name in TEMPLATE_IMAGES.items() if name == image.name),
        cmd=list(image.cmd) if image.cmd is not None else None,
        entrypoint=list(image.entrypoint) if image.entrypoint is not None else None,
    )


@endpoint(
    "GET",
    "/v1/images",
    summary="The images sandboxes are created from: the catalogue's and the tenant's own",
    tags=TAGS,
    auth="tenant_or_admin",
    response=ImageList,
)
async def list_images(call: Call) -> ImageList:
    found = [_info(image) for image in await call.services.images.list()]
    if isinstance(call.principal, Principal):  # the admin sees the catalogue
        owned = await call.services.sandboxes.owned.of_tenant(call.principal.tenant_id)
        found += [owned_info(image) for image in owned]
    return ImageList(images=found)


@endpoint(
    "GET",
    "/v1/images/{ref}",
    summary="One image, by name or digest (a catalogue image's, or the tenant's own by name)",
    tags=TAGS,
    auth="tenant_or_admin",
    response=ImageInfo,
    errors=(404,),
)
async def get_image(call: Call) -> ImageInfo:
    ref = call.path["ref"]
    image = await call.services.images.find(ref)
    if image is not None:
        return _info(image)
    if isinstance(call.principal, Principal):
        owned = await call.services.sandboxes.owned.find(call.principal.tenant_id, ref)
        if owned is not None:
            return owned_info(owned)
    raise ImageNotFound(f"no image named {ref!r}")


@endpoint(
    "POST",
    "/v1/images",
    summary="Build an image of the tenant's own from a Dockerfile (and a context archive), "
    "in a sandbox; its log streamed",
    tags=TAGS,
    status=200,
    errors=(409, 429),
    form=BUILD_FORM,
    stream=(
        "application/x-ndjson",
        'the build\'s log, one JSON object per line: {"step": ...} as each step begins, '
        '{"log": ..., "stream": ...} as a RUN writes, and last {"image": {...}} or '
        '{"error": {"code": ..., "message": ...}}',
    ),
)
async def build_image(call: Call) -> Response:
    form = await _form(call.request)
    try:
        build = await call.services.builds.prepare(call.tenant, await _ask(form))
    except BaseException:
        _close(form)
        raise

    async def lines() -> AsyncIterator[bytes]:
        try:
            async with contextlib.aclosing(build.log()) as events:
                async for event in events:
                    yield output.ndjson_line(event)
        finally:
            _close(form)

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@endpoint(
    "DELETE",
    "/v1/images/{name}",
    summary="Delete one of the tenant's images (and its snapshot)",
    tags=TAGS,
    status=204,
    errors=(404, 409),
)
async def delete_image(call: Call) -> None:
    await call.services.builds.delete(call.tenant, call.path["name"])


async def _form(request: Request) -> FormData:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise UnsupportedMediaType("request body must be multipart/form-data")
    # the whole body is bounded by max_body_bytes (middleware); a field by this
    return await request.form(max_files=2, max_fields=16, max_part_size=MAX_DOCKERFILE_BYTES)


async def _ask(form: FormData) -> BuildAsk:
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if key in ("dockerfile", "context"):
            continue
        if not isinstance(value, str):
            raise ValidationFailed(f"the form's {key!r} is a field, not a file")
        fields[key] = _network(value) if key == "network" else value
    try:
        checked = _BuildFields.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(form)"
        raise ValidationFailed(f"{where}: {first['msg']}") from None
    dockerfile = form.get("dockerfile")
    if isinstance(dockerfile, UploadFile):
        raw = await dockerfile.read(MAX_DOCKERFILE_BYTES + 1)
        if len(raw) > MAX_DOCKERFILE_BYTES:
            raise PayloadTooLarge(f"the Dockerfile is over {MAX_DOCKERFILE_BYTES} bytes")
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise ValidationFailed("the Dockerfile is not UTF-8 text") from None
    elif isinstance(dockerfile, str):
        text = dockerfile
    else:
        raise ValidationFailed("the form needs a 'dockerfile' (its text, as a field or a file)")
    context = form.get("context")
    if context is not None and not isinstance(context, UploadFile):
        raise ValidationFailed("the form's 'context' is a file (a tar archive)")
    return BuildAsk(
        name=checked.name,
        dockerfile=text,
        context=_chunks(context) if context is not None else None,
        network=checked.network,
        cpu=checked.cpu,
        memory_mb=checked.memory_mb,
        disk_mb=checked.disk_mb,
        timeout_s=checked.timeout_s,
    )


def _network(value: str) -> Any:
    text = value.strip()
    if text.startswith(("{", "[", '"')):
        try:
            return json.loads(text)
        except ValueError:
            raise ValidationFailed("network: not valid JSON") from None
    return text


def _chunks(upload: UploadFile) -> Callable[[], AsyncIterator[bytes]]:
    async def read() -> AsyncIterator[bytes]:
        await upload.seek(0)
        while chunk := await upload.read(CHUNK):
            yield chunk

    return read


def _close(form: FormData) -> None:
    """Close the form's files now (a cancelled answer cannot await)."""
    for _, value in form.multi_items():
        if isinstance(value, UploadFile):
            value.file.close()


endpoints = [list_images, get_image, build_image, delete_image]
