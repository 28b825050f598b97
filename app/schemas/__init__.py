"""Request and response bodies of the HTTP API, as pydantic models."""
