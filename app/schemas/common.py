"""Pieces shared by every schema module."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Base of request bodies: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable error code", examples=["invalid_json"])
    message: str
    details: object | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class Page(Strict):
    limit: int = Field(50, ge=1, le=500)
    after: str | None = Field(None, max_length=64, description="cursor: the last id seen")
