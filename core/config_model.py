"""The base of every ``headwater.yaml`` model: frozen, unknown keys rejected, fields by name or alias."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    """Frozen; an unknown key is an error naming its field path, never a silently ignored setting."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
