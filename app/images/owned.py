"""Images tenants own (``tenant_images``): what a build through the API made
(``app.images.build``), each a snapshot of the build's sandbox and the config a sandbox
made from it starts with. A tenant sees, uses and deletes only its own; a name is taken
once among a tenant's live images (a unique index on them: two builds racing for one name
cannot both keep it).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import TenantImage
from app.errors import Conflict, ImageNotFound
from app.schemas.images import ImageInfo


class OwnedImages:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def find(self, tenant_id: str, name: str) -> TenantImage | None:
        """The tenant's live image ``name``, or None."""
        query = select(TenantImage).where(
            TenantImage.tenant_id == tenant_id,
            TenantImage.name == name,
            TenantImage.deleted_at.is_(None),
        )
        async with self._sessions() as session:
            return (await session.scalars(query)).first()

    async def get(self, tenant_id: str, name: str) -> TenantImage:
        found = await self.find(tenant_id, name)
        if found is None:
            raise ImageNotFound(f"no image named {name!r}")
        return found

    async def of_tenant(self, tenant_id: str) -> list[TenantImage]:
        query = (
            select(TenantImage)
            .where(TenantImage.tenant_id == tenant_id, TenantImage.deleted_at.is_(None))
            .order_by(TenantImage.name)
        )
        async with self._sessions() as session:
            return list((await session.scalars(query)).all())

    async def using_snapshot(self, tenant_id: str, snapshot_id: str) -> TenantImage | None:
        """The live image whose files are the snapshot ``snapshot_id``, if any."""
        query = select(TenantImage).where(
            TenantImage.tenant_id == tenant_id,
            TenantImage.snapshot_id == snapshot_id,
            TenantImage.deleted_at.is_(None),
        )
        async with self._sessions() as session:
            return (await session.scalars(query)).first()

    async def add(self, image: TenantImage) -> None:
        """Record a built image; ``Conflict`` if the tenant named another live one so
        meanwhile."""
        try:
            async with self._sessions() as session, session.begin():
                session.add(image)
        except IntegrityError:
            raise Conflict(f"the tenant already has an image named {image.name!r}") from None

    async def forget(self, image_id: str) -> None:
        """Mark an image deleted (its name free again)."""
        async with self._sessions() as session, session.begin():
            row = await session.get(TenantImage, image_id)
            if row is not None and row.deleted_at is None:
                row.deleted_at = datetime.now(UTC)


def owned_info(image: TenantImage) -> ImageInfo:
    """What ``/v1/images`` shows of a tenant's image."""
    command = image.command or {}
    return ImageInfo(
        name=image.name,
        scope="tenant",
        digest=None,
        size_bytes=image.size_bytes,
        created_at=image.created_at,
        source="dockerfile",
        user=image.user,
        workdir=image.workdir,
        packages=[],
        templates=[],
        parent=image.parent,
        env=dict(image.env or {}),
        cmd=command.get("cmd"),
        entrypoint=command.get("entrypoint"),
    )
