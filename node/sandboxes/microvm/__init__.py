"""MicroVM sandboxes (QEMU)."""
