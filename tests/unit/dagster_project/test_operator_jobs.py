"""The operator jobs refuse names that are not in headwater.yaml with the library's one-line message (no services)."""

from __future__ import annotations

import pytest
import yaml
from dagster import DagsterInstance

from core.config import load_config
from dagster_project.definitions import build_definitions


@pytest.fixture
def defs(tmp_path):
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "ops",
        "home": ".headwater",
        "sources": {
            "shop": {"dsn": "postgresql://capture:${NO_SUCH_PW}@127.0.0.1:1/shop", "tables": ["public.orders"]},
            "crm": {"dsn": "postgresql://capture@127.0.0.1:1/crm", "schemas": ["sales"]},
        },
        "feeds": {"clean": {"from": "shop.public.orders", "sql": "SELECT id FROM source", "key": ["id"]}},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return build_definitions(load_config(path, strict_env=False))


def failure_message(defs, job: str, op: str, config: dict) -> str:
    result = defs.resolve_job_def(job).execute_in_process(
        run_config={"ops": {op: {"config": config}}}, instance=DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return failure.event_specific_data.user_failure_data.description


@pytest.mark.parametrize(
    ("source", "tables", "message"),
    [
        ("nope", ["public.orders"], "no source named 'nope' in "),
        ("crm", ["public.leads"], "source 'crm' does not capture public.leads (it captures schemas sales); "),
        ("crm", [], "give at least one table of source 'crm' to snapshot, e.g. public.orders"),
        ("crm", ["leads"], "table 'leads' needs its schema, e.g. public.leads"),
    ],
)
def test_resnapshot_refuses_what_the_config_does_not_capture(defs, monkeypatch, source, tables, message):
    monkeypatch.setenv("NO_SUCH_PW", "secret")
    got = failure_message(defs, "resnapshot_source", "incremental_snapshot", {"source": source, "tables": tables})
    assert got.startswith(message) and "\n" not in got


def test_resnapshot_needs_the_source_password_variable(defs, monkeypatch):
    monkeypatch.delenv("NO_SUCH_PW", raising=False)
    got = failure_message(defs, "resnapshot_source", "incremental_snapshot", {"source": "shop", "tables": ["x.y"]})
    assert "NO_SUCH_PW" in got and "\n" not in got


def test_reprocess_refuses_an_unknown_name(defs):
    got = failure_message(defs, "reprocess", "reprocess_version", {"name": "nope"})
    assert got == "no feed or warehouse table named 'nope'; known: clean"
