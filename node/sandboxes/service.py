"""The sandbox side of a node: its backends and manager, built from the node's settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from node.sandboxes.base import ImageFetchFailed, ImageUnavailable, RootImage, create_backend
from node.sandboxes.manager import CreateLimits, SandboxManager
from node.settings import NodeSettings


def image_store_resolver(
    images_dir: Path, *, control_urls: list[str] | None = None, token: str | None = None
) -> Callable[[str], RootImage]:
    """Images by name or digest from the node's image store (``images``); with
    ``control_urls`` (and the node token), a digest the store lacks is fetched from the
    control plane."""
    from images.errors import ImageError, ImageFetchError
    from images.fetch import ImageFetcher
    from images.store import ImageStore

    fetcher = ImageFetcher(ImageStore(images_dir), control_urls or [], token or "")

    def resolve(ref: str) -> RootImage:
        try:
            image = fetcher.resolve(ref)
        except ImageFetchError as exc:
            raise ImageFetchFailed(str(exc)) from exc
        except ImageError as exc:
            raise ImageUnavailable(str(exc)) from exc
        return RootImage(
            digest=image.digest,
            rootfs=image.rootfs,
            env=tuple(sorted(image.env.items())),
            workdir=image.workdir,
        )

    return resolve


def build_manager(
    settings: NodeSettings, *, resolve_image: Callable[[str], RootImage] | None = None
) -> SandboxManager:
    backends = {name: create_backend(name, settings) for name in settings.sandbox_backends}
    if settings.dev_mode:  # tests: {"sandbox_aliases": {"crun": "fake"}} offers fake as crun
        for alias, real in dict(settings.fake.get("sandbox_aliases", {})).items():
            backends[str(alias)] = backends[str(real)]
    if resolve_image is None:
        token = settings.node_token.get_secret_value() if settings.node_token else None
        resolve_image = image_store_resolver(
            settings.resolved_images_dir, control_urls=settings.control_urls, token=token
        )
    return SandboxManager(
        backends,
        resolve_image,
        state_dir=settings.data_dir.resolve() / "sandboxes" / ".records",
        warm=settings.sandbox_warm,
        max_warm=settings.sandbox_max_warm,
        limits=CreateLimits(
            max_sandboxes=settings.sandbox_max,
            concurrency=settings.sandbox_create_concurrency,
            queue=settings.sandbox_create_queue,
            wait_s=settings.sandbox_create_wait_seconds,
            memory_mb=settings.resolved_sandbox_memory_mb,
            cpu=settings.resolved_sandbox_cpu,
        ),
    )
