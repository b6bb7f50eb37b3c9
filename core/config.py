"""The ``headwater.yaml`` project model, validated once at load (keys documented in the README).

Key names are a public contract. Every model is frozen and rejects unknown keys, so
a typo is an error that names its field path instead of a silently ignored setting.
DSN and Kafka passwords are :class:`pydantic.SecretStr`: ``repr``/``str`` never show them.
"""

from __future__ import annotations

import graphlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from core.config_model import ConfigModel
from core.deployment import SparkConfig
from core.errors import ConfigError
from core.log_config import LogConfig
from core.sink_config import SinkConfig
from core.source_config import SourceConfig
from core.warehouse_config import WarehouseConfig

CONFIG_ENV_VAR = "HEADWATER_CONFIG"
DEFAULT_CONFIG_NAME = "headwater.yaml"

_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


#: Hash algorithms of a column mask (Debezium's ``column.mask.hash.<algorithm>``: the JCA name without dash).


class ExpectationConfig(BaseModel):
    """A Great Expectations 1.x expectation: its name under ``expect``, its arguments beside it."""

    model_config = ConfigDict(frozen=True, extra="allow")

    expect: Annotated[str, Field(pattern=r"^expect_[a-z0-9_]+$")]
    action: Literal["warn", "drop", "fail"] | None = None
    blocking: bool = False

    @property
    def kwargs(self) -> dict[str, Any]:
        """The expectation's own arguments (everything but ``expect``, ``action``, ``blocking``)."""
        return dict(self.model_extra or {})


class FeedConfig(ConfigModel):
    """A derived feed: SQL over the current row image of ``from``, keyed by ``key``."""

    from_: str = Field(alias="from")
    sql: str
    key: tuple[str, ...]
    expectations: tuple[ExpectationConfig, ...] = ()
    #: Tables joined in the SQL: view name -> topic or feed, read as its latest value per key.
    lookups: dict[str, str] = {}


class ProjectConfig(ConfigModel):
    """The whole ``headwater.yaml``."""

    project: Annotated[str, Field(pattern=_NAME)]
    home: Path = Path(".headwater")
    log: LogConfig = LogConfig()
    sources: dict[str, SourceConfig] = {}
    feeds: dict[str, FeedConfig] = {}
    warehouse: WarehouseConfig = WarehouseConfig()
    quality: dict[str, tuple[ExpectationConfig, ...]] = {}
    spark: SparkConfig = SparkConfig()
    sinks: dict[str, SinkConfig] = {}

    #: The file this config was loaded from (set by :func:`load_config`).
    config_path: Path | None = Field(default=None, exclude=True)

    @field_validator("sources", "feeds", "sinks")
    @classmethod
    def _names_are_identifiers(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not re.match(_NAME, name):
                msg = f"name {name!r} must be letters, digits and '_' and not start with a digit"
                raise ValueError(msg)
        return value

    @property
    def home_dir(self) -> Path:
        """The state directory, resolved against the config file's folder."""
        return self._beside_config(self.home)

    def _beside_config(self, path: Path) -> Path:
        if path.is_absolute() or self.config_path is None:
            return path
        return self.config_path.parent / path

    @property
    def checkpoint_dir(self) -> Path:
        """Spark jobs' streaming checkpoints: ``spark.checkpoint_path``, default ``<home>/checkpoints``."""
        configured = self.spark.checkpoint_path
        return self.home_dir / "checkpoints" if configured is None else self._beside_config(configured)

    @property
    def warehouse_root(self) -> str:
        """The warehouse's location: an absolute local path, or an object store URL (no trailing ``/``)."""
        path = self.warehouse.path
        if path is None:
            return str(self.home_dir / "warehouse")
        if path.lower().startswith("file://"):
            path = path[len("file://") :]
        elif "://" in path:
            return path
        return str(self._beside_config(Path(path)))


def find_config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Locate the config: ``--config``, else ``$HEADWATER_CONFIG``, else ``./headwater.yaml``."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(CONFIG_ENV_VAR)
    if env:
        return Path(env)
    return Path.cwd() / DEFAULT_CONFIG_NAME


def unset_variables(text: str) -> list[str]:
    """The ``${VAR}`` references still in ``text``: variables that were unset when the config was loaded.

    A config loaded with ``strict_env=False`` keeps them as written; a DSN holding one
    cannot log in, so a command reports the source instead of connecting.
    """
    return _ENV_REF.findall(text)


def _interpolate(node: Any, path: str, source: Path, env: Mapping[str, str], strict: bool = True) -> Any:
    if isinstance(node, str):

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                if not strict:
                    return match.group(0)  # left as written; only commands that use it need it
                msg = f"{source}: {path}: environment variable {name} is not set; export it or edit the file"
                raise ConfigError(msg, path=str(source), field=path)
            return env[name]

        return _ENV_REF.sub(replace, node)
    if isinstance(node, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k), source, env, strict) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", source, env, strict) for i, v in enumerate(node)]
    return node


def _describe(error: dict[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = error.get("input")
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {got!r}"
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling"
    if kind == "missing":
        return "is required"
    if kind == "string_pattern_mismatch":
        return f"{got!r} does not match {ctx.get('pattern')}"
    message = str(error.get("msg", "invalid value"))
    return message.removeprefix("Value error, ")


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts).replace("from_", "from")


def parse_config(
    raw: Any, source: Path, env: Mapping[str, str] | None = None, *, strict_env: bool = True
) -> ProjectConfig:
    """Validate an already-parsed YAML document; errors name ``source`` and the field path.

    With ``strict_env=False`` an unset ``${VAR}`` stays as written instead of failing, for
    commands that never connect to a source (``log``, ``query``).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        msg = f"{source}: the file must hold a mapping of keys (project, log, sources, ...)"
        raise ConfigError(msg, path=str(source))
    data = _interpolate(raw, "", source, os.environ if env is None else env, strict_env)
    try:
        config = ProjectConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _field_path(tuple(first["loc"])) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = f"{source}: {field}: {_describe(dict(first))}{more}"
        raise ConfigError(msg, path=str(source), field=field) from None
    _check_feed_graph(config, source)
    return config.model_copy(update={"config_path": source.resolve()})


def _check_feed_graph(config: ProjectConfig, source: Path) -> None:
    """Feeds read feeds (``from``, ``lookups``) as a DAG: a cycle is an error naming it."""
    graph = {
        name: [up for up in (feed.from_, *feed.lookups.values()) if up in config.feeds]
        for name, feed in config.feeds.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle: list[str] = exc.args[1]
        name, upstream = cycle[-1], cycle[-2]
        field = "from" if config.feeds[name].from_ == upstream else "lookups"
        msg = (
            f"{source}: feeds.{name}.{field}: feeds form a cycle ({' <- '.join(reversed(cycle))}); "
            "a feed may only read raw topics or feeds upstream of it"
        )
        raise ConfigError(msg, path=str(source), field=f"feeds.{name}.{field}") from None


def load_config(explicit: str | os.PathLike[str] | None = None, *, strict_env: bool = True) -> ProjectConfig:
    """Find, read, interpolate and validate ``headwater.yaml`` (see :func:`parse_config`)."""
    path = find_config_path(explicit)
    if not path.is_file():
        msg = f"{path}: no such config file; run 'headwater init' or pass --config"
        raise ConfigError(msg, path=str(path))
    try:
        raw = _parse_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        msg = f"{path}: invalid YAML{where}: {problem}; fix the file and retry"
        raise ConfigError(msg, path=str(path)) from None
    config = parse_config(raw, path, strict_env=strict_env)
    _loaded_config_file[:] = [path]
    return config


def _parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, by libyaml when PyYAML has it (~8x faster), else in Python.

    Every Spark task reading the log loads the config again. A document libyaml refuses is parsed
    again in Python, whose messages say what was expected ("expected ',' or ']'", not libyaml's
    "did not find expected ',' or ']'"); both point at the same line and column.
    """
    loader = getattr(yaml, "CSafeLoader", None)
    if loader is not None:
        try:
            return yaml.load(text, Loader=loader)  # the safe loader, in C
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)


#: The config file this process loaded last (errors found later name it, as load errors do).
_loaded_config_file: list[Path] = []


def loaded_config_name() -> str:
    """The path of the config file this process loaded, for error messages; ``headwater.yaml`` if none."""
    return str(_loaded_config_file[0]) if _loaded_config_file else DEFAULT_CONFIG_NAME
