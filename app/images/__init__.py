"""The control plane's images: its store, names resolved to digests at create, and the
images served to nodes by digest (``wire.images``). See docs/images.md."""
