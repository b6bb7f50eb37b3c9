"""``defs``: the Dagster Definitions of the project in ``headwater.yaml``.

The config is found as the CLI finds it (``$HEADWATER_CONFIG``, else ``./headwater.yaml``);
``headwater ui`` sets ``$HEADWATER_CONFIG`` for the webserver and daemon. Definitions load
lazily, so importing this module reads no file; :func:`build_definitions` is the pure part.

Every run executes in one process (``in_process_executor``): steps share the run's single
Spark session, and deltalake never runs in a forked child (its Rust runtime panics after fork).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import Definitions, definitions, in_process_executor

from core.config import ProjectConfig, load_config
from dagster_project.assets import build_assets
from dagster_project.automation import build_sensors, quality_job, quality_schedule, warehouse_job
from dagster_project.checks import build_checks
from dagster_project.jobs import OPERATOR_JOBS, maintain_schedule
from dagster_project.resources import HeadwaterLog, HeadwaterProject, HeadwaterSpark


def project_resources(config: ProjectConfig) -> dict[str, Any]:
    """The resources every asset, check and sensor uses, bound to ``config``'s file."""
    project = HeadwaterProject(config_path=str(config.config_path))
    return {
        "project": project,
        "log": HeadwaterLog(project=project),
        "spark": HeadwaterSpark(project=project),
    }


def build_definitions(config: ProjectConfig, *, resources: Mapping[str, Any] | None = None) -> Definitions:
    """Assets, checks, jobs, sensors and schedules for ``config`` (``resources`` override the defaults)."""
    if config.config_path is None:
        msg = "build_definitions needs a config loaded from a file (load_config), so runs can read it again"
        raise ValueError(msg)
    return Definitions(
        assets=build_assets(config),
        asset_checks=build_checks(config),
        jobs=[warehouse_job, quality_job, *OPERATOR_JOBS],
        schedules=[quality_schedule, maintain_schedule],
        sensors=build_sensors(),
        resources={**project_resources(config), **(resources or {})},
        executor=in_process_executor,
    )


@definitions
def defs() -> Definitions:
    """The definitions of the project found like the CLI finds it (an unset ``${VAR}`` is left as written)."""
    return build_definitions(load_config(strict_env=False))
