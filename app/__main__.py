"""``python -m app`` is the ``corral`` command."""

from app.cli import main

main()
