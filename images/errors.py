"""Why an image could not be found, built or imported.

    ImageError
    ├── ImageNotFound     no image has that name or digest
    ├── ImageBuildError   a build, an import or an add failed (the message says which
    │                     step and why); nothing half-made is left visible
    └── ImageFetchError   the control plane could not be reached, refused, or sent a tree
                          that is not the digest asked for; nothing of it is kept

A failing tool (debootstrap, skopeo, umoci, a RUN command) is converted here at the
seam, with ``raise ImageBuildError(...) from exc`` where there is a Python exception.
"""

from __future__ import annotations


class ImageError(RuntimeError):
    """An image operation failed."""


class ImageNotFound(ImageError, LookupError):
    """No image has the name or digest asked for."""


class ImageBuildError(ImageError):
    """Building, importing or adding an image failed."""


class ImageFetchError(ImageError):
    """Fetching an image from the control plane failed."""
