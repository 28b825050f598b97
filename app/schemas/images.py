"""What ``/v1/images`` shows of an image: enough to choose one and to know what it runs
as, nothing of the host (no paths); and the lines of a build's log (``POST
/v1/images``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class ImageInfo(BaseModel):
    name: str = Field(description="the name a create gives as `image` ('' if unnamed)")
    scope: Literal["catalogue", "tenant"] = Field(
        "catalogue",
        description="catalogue: the operator's, every tenant's; tenant: built by this tenant "
        "(POST /v1/images), seen by nobody else",
    )
    digest: str | None = Field(
        description="sha256:<hex> of the image's tree (a tenant's image: none, its files "
        "are a snapshot)"
    )
    size_bytes: int = Field(description="a tenant's image: its snapshot's, counted in storage")
    created_at: datetime
    source: str = Field(description="how it was made: debootstrap, dockerfile, oci, ...")
    user: str = Field(description="who commands run as by default")
    workdir: str
    packages: list[str] = Field(description="Debian packages a recipe installed")
    templates: list[str] = Field(description="E2B template names that create this image")
    parent: str | None = Field(None, description="a tenant's image: the image it was built FROM")
    env: dict[str, str] = Field(
        default_factory=dict, description="a tenant's image: its sandboxes' environment"
    )
    cmd: list[str] | None = Field(None, description="recorded from the Dockerfile")
    entrypoint: list[str] | None = Field(None, description="recorded from the Dockerfile")


class ImageList(BaseModel):
    images: list[ImageInfo]


class BuildStep(BaseModel):
    """A build's step begins (the Dockerfile's line, or the build's own work)."""

    step: str
    line: int | None = None


class BuildLog(BaseModel):
    """Output of a RUN (or a COPY's complaint), as it comes: text of whole characters."""

    log: str
    stream: Literal["stdout", "stderr"] = "stdout"


class BuildErrorBody(BaseModel):
    code: str
    message: str


class BuildDone(BaseModel):
    """The build's last line when it succeeded."""

    image: ImageInfo


class BuildError(BaseModel):
    """The build's last line when it failed (nothing was kept)."""

    error: BuildErrorBody
