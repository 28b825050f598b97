"""Routes only nodes call (``/internal/...``), each checking the node token (``token``)."""
