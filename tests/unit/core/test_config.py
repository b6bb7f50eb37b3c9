from pathlib import Path

import pytest
import yaml

from core.config import load_config, parse_config
from core.errors import ConfigError
from core.source_config import redact_dsn
from operations.scaffold import init_project

SAMPLE = """
project: shop
home: .headwater
log:
  backend: file
  partitions: 3
  kafka:
    bootstrap_servers: localhost:9092
    client: kafka-python
sources:
  shop:
    dsn: postgresql://capture:${SHOP_PW}@localhost:5432/shop
    tables: [public.customers, public.orders]
    snapshot: initial
    heartbeat_interval_s: 10
    types:
      decimal_handling_mode: string
      time_precision_mode: adaptive
      binary_handling_mode: base64
    columns:
      exclude: [public.customers.ssn]
feeds:
  customers_clean:
    from: shop.public.customers
    sql: SELECT id, lower(email) AS email, country FROM source
    key: [id]
    expectations:
      - {expect: expect_column_values_to_not_be_null, column: email, action: drop}
warehouse:
  tables:
    customers:      {from: customers_clean, mode: scd1}
    customers_hist: {from: shop.public.customers, mode: scd2}
quality:
  customers:
    - {expect: expect_column_values_to_be_unique, column: id}
    - {expect: expect_column_values_to_be_between, column: balance, min_value: 0, blocking: true}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "headwater.yaml"
    path.write_text(text)
    return path


def test_design_sample_loads_with_interpolation(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOP_PW", "s3cret-pw")
    config = load_config(write(tmp_path, SAMPLE))
    shop = config.sources["shop"]
    assert shop.dsn.get_secret_value() == "postgresql://capture:s3cret-pw@localhost:5432/shop"
    assert shop.tables == ("public.customers", "public.orders")
    assert shop.columns.exclude == ("public.customers.ssn",)
    assert config.feeds["customers_clean"].from_ == "shop.public.customers"
    assert config.feeds["customers_clean"].expectations[0].action == "drop"
    assert config.feeds["customers_clean"].expectations[0].kwargs == {"column": "email"}
    assert config.warehouse.tables["customers_hist"].mode == "scd2"
    between = config.quality["customers"][1]
    assert between.blocking is True
    assert between.kwargs == {"column": "balance", "min_value": 0}
    assert config.home_dir == tmp_path.resolve() / ".headwater"


def test_secret_never_in_repr_or_redacted_dsn(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOP_PW", "s3cret-pw")
    config = load_config(write(tmp_path, SAMPLE))
    assert "s3cret-pw" not in repr(config)
    assert "s3cret-pw" not in str(config.sources["shop"])
    assert config.sources["shop"].dsn_redacted == "postgresql://capture:***@localhost:5432/shop"


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://u:pw@h:5432/db?sslmode=require", "postgresql://u:***@h:5432/db?sslmode=require"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("host=h user=u password=pw dbname=db", "host=h user=u password=*** dbname=db"),
        ("host=h password='p w' dbname=db", "host=h password=*** dbname=db"),
    ],
)
def test_redact_dsn(dsn, expected):
    assert redact_dsn(dsn) == expected


def test_missing_env_var_names_field_and_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("SHOP_PW", raising=False)
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, SAMPLE))
    assert "sources.shop.dsn" in str(err.value)
    assert "SHOP_PW" in str(err.value)


def test_bad_backend_is_one_line_naming_field(tmp_path):
    path = write(tmp_path, "project: p\nlog:\n  backend: carrier-pigeon\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message == f"{path}: log.backend: must be 'file' or 'kafka', got 'carrier-pigeon'"
    assert "\n" not in message


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"log\.partitons: unknown key"):
        load_config(write(tmp_path, "project: p\nlog:\n  partitons: 3\n"))


def test_malformed_yaml_names_line(tmp_path):
    with pytest.raises(ConfigError, match=r"invalid YAML at line 2, column \d+: "):
        load_config(write(tmp_path, "project: p\nlog: : :\n  - x\n"))


def test_malformed_yaml_has_pythons_message_though_libyaml_parses(tmp_path):
    """libyaml parses a valid document; one it refuses is read again in Python, whose message says what was expected."""
    assert yaml.__with_libyaml__  # else this test checks nothing libyaml-specific
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "project: p\nlog: {backend: [file\n"))
    assert "invalid YAML at line 3, column 1: expected ',' or ']', but got '<stream end>'" in str(err.value)
    text = "project: p\nlog:\n  partitions: 0x10\n  file: {fsync: never}\nsources: {}\n"
    assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.safe_load(text)  # one resolver: 0x10 is 16 in both
    assert load_config(write(tmp_path, text)).log.partitions == 16


def test_source_needs_tables_or_schemas(tmp_path):
    text = "project: p\nsources:\n  s:\n    dsn: postgresql://u@h/db\n"
    with pytest.raises(ConfigError, match=r"sources\.s: give exactly one of 'tables' or 'schemas'"):
        load_config(write(tmp_path, text))


def test_feed_from_alias_in_error_path(tmp_path):
    text = "project: p\nfeeds:\n  f:\n    sql: select 1\n    key: [id]\n"
    with pytest.raises(ConfigError, match=r"feeds\.f\.from: is required"):
        load_config(write(tmp_path, text))


def test_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="run 'headwater init'"):
        load_config(tmp_path / "nope.yaml")


def test_config_env_var_is_used(tmp_path, monkeypatch):
    path = write(tmp_path, "project: from_env\n")
    monkeypatch.setenv("HEADWATER_CONFIG", str(path))
    monkeypatch.chdir(tmp_path.parent)
    assert load_config().project == "from_env"


def test_init_template_is_valid_and_refuses_overwrite(tmp_path):
    path = init_project(tmp_path / "My-Project")
    config = parse_config(yaml.safe_load(path.read_text()), path)
    assert config.project == "My_Project"
    assert (tmp_path / "My-Project" / ".headwater").is_dir()
    with pytest.raises(ConfigError, match="already exists"):
        init_project(tmp_path / "My-Project")


def test_non_strict_env_leaves_reference_for_commands_without_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("SHOP_PW", raising=False)
    config = load_config(write(tmp_path, SAMPLE), strict_env=False)
    assert config.sources["shop"].dsn.get_secret_value() == "postgresql://capture:${SHOP_PW}@localhost:5432/shop"
