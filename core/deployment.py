"""Where Headwater's engines run: the ``spark:`` section, and settings maps that may hold secrets.

``spark:`` names the Spark master every Spark job uses (``local[2]`` by default; a
standalone ``spark://host:port``, ``yarn`` or ``k8s://...``), Spark settings passed to the
session as they are, and where streaming checkpoints live. ``warehouse.storage_options``
and ``spark.conf`` are :data:`SettingsMap`: every value is a :class:`pydantic.SecretStr`
(``repr`` never shows one) and :func:`shown_settings` masks the values whose key looks
like a credential, so a map can be printed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, field_validator


def _as_text(value: Any) -> Any:
    """YAML scalars (``2``, ``true``) as the strings Spark and delta-rs take; other values unchanged."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            out[key] = "true" if item else "false"
        elif isinstance(item, int | float):
            out[key] = str(item)
        else:
            out[key] = item
    return out


#: A map of settings (text values, any of which may be a secret given as ``${VAR}``).
SettingsMap = Annotated[dict[str, SecretStr], BeforeValidator(_as_text)]

#: Keys whose values are credentials: masked by :func:`shown_settings` (Spark's own redaction
#: pattern, ``spark.redaction.regex``, plus the names object stores use).
SECRET_KEY = re.compile(r"secret|password|token|credential|access[._]?key|account[._]?key|sas|signature", re.I)


def reveal(settings: Mapping[str, SecretStr]) -> dict[str, str]:
    """The plain values, for the library that needs them (never for output)."""
    return {key: value.get_secret_value() for key, value in settings.items()}


def shown_settings(settings: Mapping[str, SecretStr]) -> dict[str, str]:
    """The map as it may be shown: values of credential-like keys replaced by ``***``."""
    return {key: "***" if SECRET_KEY.search(key) else value.get_secret_value() for key, value in settings.items()}


_MASTER = re.compile(
    r"^(local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://[^/,\s]+:\d+(,[^/,\s]+:\d+)*|yarn|k8s://\S+)$"
)
_MEMORY = re.compile(r"^\d+[kmgt]?$", re.I)
#: Settings with a key of their own in ``spark:`` (set them there, so there is one place).
_OWN_KEYS = {"spark.master": "master", "spark.driver.memory": "driver_memory"}


class SparkConfig(BaseModel):
    """The ``spark:`` section: the master, session settings, and checkpoint storage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: ``local[N]`` (in the CLI's own JVM), ``spark://host:port[,host:port]``, ``yarn`` or ``k8s://...``.
    master: str = "local[2]"
    driver_memory: str = "1g"
    #: Spark settings passed to the session as they are (after Headwater's defaults, so they win).
    conf: SettingsMap = {}
    #: Streaming checkpoints (default ``<home>/checkpoints``): a POSIX path; on a cluster a mount
    #: every node shares (executors write the state of enriched feeds there).
    checkpoint_path: Path | None = None
    #: How long a job waits for its first executor on a cluster before giving up.
    executor_timeout_s: float = Field(default=120.0, gt=0)
    #: Spark Connect: refused (see :meth:`_no_connect`); a key so the refusal can say why.
    remote: str | None = None

    @field_validator("master")
    @classmethod
    def _known_master(cls, value: str) -> str:
        if not _MASTER.match(value.strip()):
            msg = f"must be local[N], spark://host:port, yarn or k8s://https://host:port, got {value!r}"
            raise ValueError(msg)
        return value.strip()

    @property
    def driver_memory_bytes(self) -> int:
        """``driver_memory`` in bytes (a JVM size: no suffix is bytes, k/m/g/t are powers of 1024)."""
        text = self.driver_memory.strip().lower()
        power = "kmgt".find(text[-1]) + 1 if text[-1] in "kmgt" else 0
        return int(text[:-1] if power else text) << (10 * power)

    @field_validator("driver_memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        if not _MEMORY.match(value):
            msg = f"must be a JVM memory size such as 1g or 512m, got {value!r}"
            raise ValueError(msg)
        return value

    @field_validator("conf")
    @classmethod
    def _spark_keys(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for key in value:
            if key in _OWN_KEYS:
                msg = f"{key}: set spark.{_OWN_KEYS[key]} instead"
                raise ValueError(msg)
            if key.startswith(("spark.remote", "spark.api.mode")):
                msg = f"{key}: Spark Connect is not supported (see spark.remote)"
                raise ValueError(msg)
            if not key.startswith("spark."):
                msg = f"{key!r} is not a Spark setting (they start with 'spark.')"
                raise ValueError(msg)
        return value

    @field_validator("remote")
    @classmethod
    def _no_connect(cls, value: str | None) -> str | None:
        if value is not None:
            msg = (
                "Spark Connect is not supported: a feed's micro-batch code holds the driver's open log and "
                "reads Spark's plans through the driver's JVM, and Connect runs foreachBatch on its server "
                "(measured: the log source and loads work through sc://, feeds fail); "
                "use master: spark://host:port (or yarn, k8s://...) instead"
            )
            raise ValueError(msg)
        return value

    @property
    def is_local(self) -> bool:
        """True when Spark runs inside the driver's JVM (executors share the driver's host and files)."""
        return self.master.startswith("local")

    def session_conf(self) -> dict[str, str]:
        """``conf`` with its values revealed, for the session."""
        return reveal(self.conf)
