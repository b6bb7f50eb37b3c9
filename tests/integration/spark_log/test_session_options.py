"""The JVM options a Spark driver really starts with (read back from the running JVM)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from spark_log.session import JAVA_OPTIONS_VARIABLE


@pytest.mark.skipif(
    not os.environ.get(JAVA_OPTIONS_VARIABLE), reason=f"${JAVA_OPTIONS_VARIABLE} is empty: the JVM's defaults"
)
def test_the_suite_runs_its_drivers_with_the_test_jvm_options(spark):
    """conftest sets ``$HEADWATER_SPARK_JAVA_OPTIONS``; the session fixture's JVM has each option."""
    wanted = os.environ[JAVA_OPTIONS_VARIABLE].split()
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert all(option in arguments for option in wanted), arguments


def test_project_options_follow_the_variable_and_an_empty_variable_adds_nothing(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from spark_log.session import spark_session, stop_spark
        session = spark_session(
            "options", local_dir=Path(sys.argv[1]), extra_conf={"spark.driver.extraJavaOptions": "-Dheadwater.probe=1"}
        )
        bean = session.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
        print(json.dumps(list(bean.getInputArguments())))
        stop_spark(session)
        """
    )
    runs = {}
    for value in ("-XX:+UseSerialGC", ""):
        env = {**os.environ, JAVA_OPTIONS_VARIABLE: value}
        result = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / f"run{len(runs)}")],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        runs[value] = result.stdout.strip().splitlines()[-1]
    with_variable, without = runs["-XX:+UseSerialGC"], runs[""]
    assert "-XX:+UseSerialGC" in with_variable and "-Dheadwater.probe=1" in with_variable
    assert with_variable.index("-XX:+UseSerialGC") < with_variable.index("-Dheadwater.probe=1")
    assert "-XX:+UseSerialGC" not in without and "-Dheadwater.probe=1" in without
