"""API keys: an admin creates one per tenant; only its hash is stored."""

from __future__ import annotations

from pydantic import Field

from wire.base import Input, Wire


class ApiKeyCreate(Input):
    tenant: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    admin: bool = False


class ApiKeyCreated(Wire):
    key: str = Field(description="Shown once; only its hash is stored.")
    tenant: str
    admin: bool
