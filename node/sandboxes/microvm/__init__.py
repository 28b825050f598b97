"""MicroVM sandboxes: QEMU ``-M microvm`` guests (docs/microvm.md)."""
