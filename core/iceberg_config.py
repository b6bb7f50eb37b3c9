"""The ``warehouse.iceberg:`` section of ``headwater.yaml``: the catalog Iceberg tables live in, how they are written.

```yaml
warehouse:
  format: iceberg                     # or per table: warehouse.tables.<t>.format
  iceberg:
    catalog: {type: sql}              # default: SQLite at <home>/iceberg/catalog.db (no server)
    # catalog: {type: sql, uri: "postgresql://hw:${CATALOG_PW}@db:5432/iceberg"}
    # catalog: {type: rest, uri: https://polaris.example/api/catalog,
    #           properties: {credential: "${ID}:${SECRET}", warehouse: wh}}
    namespace: headwater
```

How a table is written is not an Iceberg setting: ``warehouse.merge_on_read`` (per table
``tables.<t>.merge_on_read``) says it for every format; unset, an Iceberg table is
copy-on-write. The ``write_mode`` key this section once had is refused in one line naming that.

The catalog URI and properties may hold secrets: they are :data:`core.deployment.SettingsMap`
values or masked in every display, never logged.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator

from core.config_model import ConfigModel
from core.deployment import SettingsMap


class IcebergCatalogConfig(ConfigModel):
    """Which Iceberg catalog: ``sql`` (SQLite, the embedded default, or PostgreSQL) or ``rest``."""

    type: Literal["sql", "rest"] = "sql"
    #: ``sqlite:///PATH`` or ``postgresql://...`` (sql; default: SQLite under ``<home>/iceberg``);
    #: the catalog's ``http(s)://`` URL (rest, required).
    uri: SecretStr | None = None
    #: Passed to the catalog as they are (REST: ``credential``, ``token``, ``warehouse``, ``scope``...).
    properties: SettingsMap = {}

    @model_validator(mode="after")
    def _usable(self) -> IcebergCatalogConfig:
        uri = None if self.uri is None else self.uri.get_secret_value()
        if self.type == "rest":
            parts = urlsplit(uri or "")
            if parts.scheme not in ("http", "https") or not parts.hostname:
                msg = "a rest catalog needs uri: its http(s):// URL"
                raise ValueError(msg)
            given = {key: value.get_secret_value() for key, value in self.properties.items()}
            if "credential" in given and ":" not in given["credential"]:
                msg = "properties.credential must be '<client id>:<client secret>'"
                raise ValueError(msg)
            if "credential" in given and "token" in given:
                msg = "give properties.credential or properties.token, not both"
                raise ValueError(msg)
        elif uri is not None and not (
            uri.startswith("sqlite:///") or uri.split("://", 1)[0] in ("postgres", "postgresql")
        ):
            msg = "a sql catalog's uri must be sqlite:///PATH or postgresql://USER@HOST/DB"
            raise ValueError(msg)
        return self


class IcebergConfig(ConfigModel):
    """Iceberg tables' catalog and namespace."""

    catalog: IcebergCatalogConfig = IcebergCatalogConfig()
    namespace: str = Field(default="headwater", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @model_validator(mode="before")
    @classmethod
    def _no_write_mode(cls, data: Any) -> Any:
        if isinstance(data, dict) and "write_mode" in data:
            wanted = "true" if data["write_mode"] == "merge-on-read" else "false"
            msg = (
                f"write_mode is no longer an Iceberg setting: remove it and set warehouse.merge_on_read: {wanted} "
                "(or tables.<t>.merge_on_read); unset, Iceberg tables are copy-on-write"
            )
            raise ValueError(msg)
        return data
