"""What ``/v1/images`` shows of an image: enough to choose one and to know what it runs
as, nothing of the host (no paths)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ImageInfo(BaseModel):
    name: str = Field(description="the name a create gives as `image` ('' if unnamed)")
    digest: str = Field(description="sha256:<hex> of the image's tree")
    size_bytes: int
    created_at: datetime
    source: str = Field(description="how it was made: debootstrap, dockerfile, oci, ...")
    user: str = Field(description="who commands run as by default")
    workdir: str
    packages: list[str] = Field(description="Debian packages a recipe installed")
    templates: list[str] = Field(description="E2B template names that create this image")


class ImageList(BaseModel):
    images: list[ImageInfo]
