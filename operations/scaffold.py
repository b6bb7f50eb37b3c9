"""``headwater init``: a commented starter ``headwater.yaml`` and the state directory."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from core.config import DEFAULT_CONFIG_NAME, parse_config
from core.errors import ConfigError

_TEMPLATE = """\
# Headwater project configuration. Reference: README.md, section "Configuration".
# ${{VAR}} is replaced from the environment when the file is loaded.
project: {project}

# State directory (log, checkpoints, warehouse, reports), relative to this file.
home: .headwater

log:
  backend: file          # file (embedded, no server) | kafka
  partitions: 3          # partitions for new topics
  # kafka:
  #   bootstrap_servers: localhost:9092
  #   client: kafka-python   # kafka-python | confluent-kafka

# Register a database with:
#   headwater source add shop --dsn 'postgresql://capture:${{SHOP_PW}}@localhost:5432/shop' --tables public.customers
sources: {{}}

# Derived feeds: SQL over the current row image of a topic or another feed.
# feeds:
#   customers_clean:
#     from: shop.public.customers
#     sql: SELECT id, lower(email) AS email, country FROM source
#     key: [id]
#     expectations:
#       - {{expect: expect_column_values_to_not_be_null, column: email, action: drop}}
feeds: {{}}

# Warehouse tables: scd1 (current state) or scd2 (full history).
warehouse:
  tables: {{}}

# Data-quality suites (Great Expectations 1.x expectations) per warehouse table.
quality: {{}}
"""


def project_name_for(directory: Path) -> str:
    """A valid project name derived from a directory name."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", directory.resolve().name) or "project"
    return name if not name[0].isdigit() else f"p_{name}"


def init_project(directory: Path, project: str | None = None) -> Path:
    """Write ``headwater.yaml`` and the state dir into ``directory``; never overwrite a config."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / DEFAULT_CONFIG_NAME
    if path.exists():
        msg = f"{path}: already exists; edit it, or run 'headwater init' in another directory"
        raise ConfigError(msg, path=str(path))
    text = _TEMPLATE.format(project=project or project_name_for(directory))
    config = parse_config(yaml.safe_load(text), path)  # the template must always validate
    path.write_text(text, encoding="utf-8")
    (directory / config.home).mkdir(parents=True, exist_ok=True)
    return path
