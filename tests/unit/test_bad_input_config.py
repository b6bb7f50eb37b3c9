"""Bad-input catalogue, part 1: broken ``headwater.yaml`` files, through the real CLI (issue 9).

Each case writes one bad file and runs ``headwater --config FILE <command>`` in a
subprocess: exit code non-zero, exactly one line on stderr (no traceback) that names
the problem (field path, file) and what to do, and the DSN password nowhere in the
output. No service is needed: every command here stops at config validation, before
it would connect anywhere. The cases that need Postgres, the log or Spark are in
``tests/integration/test_bad_input.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PASSWORD = "Catalogue-Pw-93xQ"  # distinctive, so any leak into the output is found
DSN = f"postgresql://capture:{PASSWORD}@127.0.0.1:1/shop"
SOURCE = f"""
sources:
  shop:
    dsn: "{DSN}"
    tables: [public.customers]
"""
FEED = """
  clean:
    from: shop.public.customers
    sql: SELECT id, name FROM source
    key: [id]
"""


@dataclass(frozen=True)
class Case:
    """One broken config: its text, the command run on it, and words the error line must hold."""

    text: str
    args: tuple[str, ...]
    expect: tuple[str, ...]


def run_cli(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headwater", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *expect: str) -> str:
    """Non-zero exit, one ``error:`` line on stderr naming ``expect``, no password anywhere."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: ") and len(line) > len("error: ")
    for word in expect:
        assert word in line, f"{word!r} missing from: {line}"
    assert PASSWORD not in result.stdout + result.stderr
    return line


CASES = [
    pytest.param(
        Case("project: p\nlog: {backend: file\n", ("source", "list"), ("invalid YAML at line", "fix the file")),
        id="malformed-yaml",
    ),
    pytest.param(
        Case("project: p\n\tlog: {}\n", ("source", "list"), ("invalid YAML", "fix the file")),
        id="yaml-tab-indent",
    ),
    pytest.param(
        Case("- project\n- p\n", ("source", "list"), ("must hold a mapping",)),
        id="yaml-not-a-mapping",
    ),
    pytest.param(
        Case("project: p\ncolour: red\n" + SOURCE, ("source", "list"), ("colour: unknown key", "check its spelling")),
        id="unknown-top-level-key",
    ),
    pytest.param(
        Case(
            "project: p\n" + SOURCE + "    snapshto: initial\n",
            ("source", "list"),
            ("sources.shop.snapshto: unknown key", "check its spelling"),
        ),
        id="unknown-nested-key",
    ),
    pytest.param(
        Case("project: p\nlog: {backend: carrier-pigeon}\n", ("source", "list"), ("log.backend", "carrier-pigeon")),
        id="bad-enum-value",
    ),
    pytest.param(
        Case("project: p\nlog: {partitions: 0}\n", ("source", "list"), ("log.partitions", "greater than or equal")),
        id="partitions-out-of-range",
    ),
    pytest.param(
        Case("project: my project\n", ("source", "list"), ("project", "does not match")),
        id="project-name-not-identifier",
    ),
    pytest.param(
        Case("log: {}\n", ("source", "list"), ("project: is required",)),
        id="project-missing",
    ),
    pytest.param(
        Case(
            "project: p\nsources:\n  shop:\n    dsn: postgresql://capture:${HW_CATALOGUE_UNSET_PW}@h/db\n"
            "    tables: [public.t]\n",
            ("source", "list"),
            ("sources.shop.dsn", "HW_CATALOGUE_UNSET_PW is not set", "export it"),
        ),
        id="password-variable-unset",
    ),
    pytest.param(
        Case(
            f'project: p\nsources:\n  shop:\n    dsn: "{DSN}"\n',
            ("source", "list"),
            ("sources.shop", "exactly one of 'tables' or 'schemas'"),
        ),
        id="source-without-tables",
    ),
    pytest.param(
        Case(
            f'project: p\nsources:\n  "shop-eu":\n    dsn: "{DSN}"\n    tables: [public.t]\n',
            ("source", "list"),
            ("sources", "'shop-eu'", "letters, digits and '_'"),
        ),
        id="source-name-not-identifier",
    ),
    pytest.param(
        Case(
            "project: p\n" + SOURCE + "    types: {decimal_handling_mode: base64}\n",
            ("source", "list"),
            ("sources.shop.types.decimal_handling_mode", "'string', 'precise' or 'double'"),
        ),
        id="bad-type-mode",
    ),
    pytest.param(
        Case(
            "project: p\n" + SOURCE + "feeds:\n" + FEED.replace("key: [id]", "key: id, name"),
            ("source", "list"),
            ("feeds.clean.key",),
        ),
        id="feed-key-not-a-list",
    ),
    pytest.param(
        Case(
            "project: p\n" + SOURCE + "feeds:\n" + FEED.replace("    sql: SELECT id, name FROM source\n", ""),
            ("source", "list"),
            ("feeds.clean.sql: is required",),
        ),
        id="feed-without-sql",
    ),
    pytest.param(
        Case(
            "project: p\n"
            + SOURCE
            + "feeds:\n"
            + FEED.replace("shop.public.customers", "other")
            + FEED.replace("clean", "other").replace("shop.public.customers", "clean"),
            ("source", "list"),
            ("feeds form a cycle", "clean <- other <- clean", "upstream"),
        ),
        id="feed-cycle",
    ),
    pytest.param(
        Case(
            "project: p\n"
            + SOURCE
            + "feeds:\n"
            + FEED
            + "    expectations:\n      - {expect: expect_column_values_to_not_be_null, column: id, action: explode}\n",
            ("source", "list"),
            ("feeds.clean.expectations[0].action", "'warn', 'drop' or 'fail'", "explode"),
        ),
        id="expectation-bad-action",
    ),
    pytest.param(
        Case(
            "project: p\nquality:\n  t:\n    - {expect: ColumnValuesNotNull, column: id}\n",
            ("source", "list"),
            ("quality.t[0].expect", "ColumnValuesNotNull"),
        ),
        id="expectation-name-not-snake-case",
    ),
    pytest.param(
        Case(
            "project: p\nwarehouse:\n  tables:\n    t: {from: shop.public.customers, mode: scd3}\n",
            ("source", "list"),
            ("warehouse.tables.t.mode", "'scd1' or 'scd2'", "scd3"),
        ),
        id="warehouse-bad-mode",
    ),
    pytest.param(
        Case(
            "project: p\nwarehouse:\n  tables:\n    t: {mode: scd1}\n",
            ("source", "list"),
            ("warehouse.tables.t.from: is required",),
        ),
        id="warehouse-table-without-from",
    ),
    pytest.param(
        Case(
            "project: p\nsinks:\n  hook: {kind: webhook, from: a.b.c, options: {url: 'ftp://x'}}\n",
            ("sinks", "run", "--until-caught-up"),
            ("sinks.hook.options.url", "does not match"),
        ),
        id="sink-bad-url",
    ),
    pytest.param(
        Case(
            "project: p\nsinks:\n  r: {kind: redis, from: a.b.c, options: {strem: x}}\n",
            ("sinks", "run", "--until-caught-up"),
            ("sinks.r.options.strem", "unknown key"),
        ),
        id="sink-unknown-option",
    ),
    pytest.param(
        Case(
            "project: p\nsinks:\n  r: {kind: redis, from: a.b.c}\n",
            ("sinks", "run", "nosuch", "--until-caught-up"),
            ("sink nosuch", "no such sink", "sinks: r"),
        ),
        id="sink-unknown-name",
    ),
    pytest.param(
        Case(
            "project: p\nsinks:\n  r: {kind: redis, from: a.b.c, filter: 'op = = 1'}\n",
            ("sinks", "run", "--until-caught-up"),
            ("sinks.r.filter", "cannot be evaluated"),
        ),
        id="sink-bad-filter",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_bad_config_is_one_line(case: Case, tmp_path: Path) -> None:
    config = tmp_path / "headwater.yaml"
    config.write_text(case.text)
    line = assert_one_line_error(run_cli(config, *case.args), *case.expect)
    assert str(config) in line or "headwater.yaml" in line  # the file is named


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    assert_one_line_error(run_cli(missing, "source", "list"), str(missing), "no such config file", "headwater init")


def test_config_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "headwater.yaml").mkdir()
    assert_one_line_error(run_cli(tmp_path / "headwater.yaml", "source", "list"), "is a directory", "--help")


def test_dsn_password_not_echoed_in_validation_error(tmp_path: Path) -> None:
    # A wrong type next to the DSN: the error names the field, never the DSN's value.
    config = tmp_path / "headwater.yaml"
    config.write_text("project: p\n" + SOURCE + "    heartbeat_interval_s: often\n")
    assert_one_line_error(run_cli(config, "source", "list"), "sources.shop.heartbeat_interval_s")


def test_unknown_option_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "headwater.yaml"
    config.write_text("project: p\n")
    assert_one_line_error(run_cli(config, "capture", "--bogus"), "No such option '--bogus'", "headwater capture --help")


def test_feed_error_names_the_config_file_in_use(tmp_path: Path) -> None:
    # A feed spec found wrong after loading names the file given with --config, not a default name.
    config = tmp_path / "shop-config.yaml"
    config.write_text(
        "project: p\nfeeds:\n  clean:\n    from: shop.public.customers\n    sql: SELECT id FROM source\n    key: []\n"
    )
    line = assert_one_line_error(run_cli(config, "feeds", "run", "clean", "--available-now"), "feeds.clean.key")
    assert line.startswith(f"error: {config}: feeds.clean.key: give at least one key column"), line
