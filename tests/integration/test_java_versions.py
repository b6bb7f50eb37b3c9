"""The pipeline runs on every Java that Spark runs on and this machine has, not only the suite's.

``make test`` runs Spark on the newest installed Java of 17, 21 and 25 (the Makefile sets
``JAVA_HOME``; on Java 25 a small Spark job used ~30 % less CPU than on 17), so every other one installed
here (Java 17 on this kind of machine) gets the smoke pipeline once (``harness.smoke``): capture,
a feed, SCD1 and SCD2 in one ``headwater run``, and a query. Skipped when there is no other.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.javas import other_javas
from harness.smoke import run_pipeline_once

OTHERS = other_javas()


@pytest.mark.parametrize("home", list(OTHERS.values()), ids=[f"java{major}" for major in OTHERS])
def test_the_pipeline_runs_on_another_installed_java(pg_database, unique_name, tmp_path, home: Path):
    run_pipeline_once(pg_database, unique_name("jv"), tmp_path, env={"JAVA_HOME": str(home)})
