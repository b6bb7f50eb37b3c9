"""The maintain_tables job and its schedule: one pass from Dagster on a real table of each format (no services)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from dagster import DagsterInstance

from core.config import load_config
from dagster_project.definitions import build_definitions
from warehouse_loader.changes import COMMIT_TS, OP, SEQ
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import table_path


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_maintain_job_compacts_and_reports_the_table(tmp_path: Path, table_format: str) -> None:
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "ops",
        "warehouse": {
            "format": table_format,
            "tables": {"orders": {"from": "shop.public.orders", "mode": "scd1"}},
            "maintenance": {"compact_min_small_files": 3, "target_file_size": 1 << 20},
        },
    }
    path.write_text(yaml.safe_dump(document))
    config = load_config(path)
    location = table_path(config, "orders")
    for n in range(5):  # new keys each time: five small files
        format_of(config, "orders").write_batch(
            location,
            pa.table(
                {
                    "id": pa.array([n * 10 + i for i in range(10)], pa.int64()),
                    SEQ: pa.array([f"{n:010d}{i:010d}" for i in range(10)]),
                    OP: pa.array(["c"] * 10),
                    COMMIT_TS: pa.array([n * 1_000_000] * 10, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                }
            ),
            table="orders",
            batch_id=n,
            keys=["id"],
            config=config.warehouse.tables["orders"],
        )
    defs = build_definitions(config)
    defs.get_repository_def().load_all_definitions()  # as the code server does: every op and job name unique
    assert "maintain_tables_hourly" in {s.name for s in defs.schedules}
    result = defs.resolve_job_def("maintain_tables").execute_in_process(
        run_config={"ops": {"maintain_pass": {"config": {"tables": []}}}}, instance=DagsterInstance.ephemeral()
    )
    assert result.success
    (event,) = [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    metadata = event.event_specific_data.materialization.metadata
    assert metadata["maintenance/files"].value == 1 and "maintenance/last_compaction" in metadata

    refused = defs.resolve_job_def("maintain_tables").execute_in_process(
        run_config={"ops": {"maintain_pass": {"config": {"tables": ["nope"]}}}},
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not refused.success
