"""Persistence: SQLAlchemy 2 models, the async engine and per-table repositories."""
