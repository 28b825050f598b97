"""Alembic migrations: the only thing that creates or changes Corral's schema."""
