"""``--cpu-profile-out``: a child burning CPU under a module is counted for that module and kind."""

import subprocess
import sys
import textwrap
from collections import Counter

from harness.suite_cpu import OUTSIDE, Timeline, command_of, kind_of, report


def test_kinds_follow_the_command_line_then_the_command_name():
    assert kind_of("java", "/usr/bin/java -cp /c/spark-home-4.3.0-x/conf org.apache.spark.deploy.SparkSubmit") == (
        "java: Spark driver"
    )
    assert kind_of("java", "java -Xmx128m org.apache.spark.launcher.Main x") == "java: Spark launcher"
    assert kind_of("python", "/v/bin/python -m pyspark.sql.streaming.python_streaming_source_runner") == (
        "python: Spark data source runner"
    )
    assert kind_of("python", "/v/bin/python -m headwater --config h.yaml load --follow") == "python: headwater CLI"
    assert kind_of("postgres", "postgres: checkpointer") == "postgres"
    assert kind_of("kworker/0:1", "") == "other: kworker/0:1"


def test_a_sample_goes_to_the_module_its_worker_ran_then():
    timeline = Timeline()
    timeline.add("gw0", 100.0, "tests/a/test_x.py::test_one")
    timeline.add("gw0", 200.0, "tests/b/test_y.py::test_two[p]")
    timeline.add("gw1", 150.0, "tests/c/test_z.py::test_three")
    assert timeline.module_at("gw0", 150.0) == "tests/a/test_x.py"
    assert timeline.module_at("gw0", 250.0) == "tests/b/test_y.py"
    assert timeline.module_at("gw1", 120.0) == "(worker start)"
    assert timeline.module_at("", 150.0) == OUTSIDE
    assert timeline.test_at("gw0", 250.0) == "tests/b/test_y.py::test_two[p]"
    samples = [(150.0, "gw0", "java: Spark driver", 3.0), (250.0, "gw0", "postgres", 1.0)]
    births = [(140.0, "gw0", "java: Spark driver"), (160.0, "gw0", "java: Spark driver")]
    text = report(samples, timeline, Counter({"java: Spark driver": 2}), births)
    assert "3   75.0 %  java: Spark driver  (2 processes, 1.50 s each)" in text
    assert "1   25.0 %  postgres\n" in text
    assert "tests/a/test_x.py  (java: Spark driver 3)" in text
    assert "tests/b/test_y.py  (postgres 1)" in text
    assert "3  tests/a/test_x.py::test_one  (2 Spark drivers started)" in text
    assert "1  tests/b/test_y.py::test_two[p]  (0 Spark drivers started)" in text


def test_a_run_counts_its_childs_cpu_for_the_running_module(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_burn.py").write_text(
        textwrap.dedent(
            """
            import subprocess, sys

            def test_burn():
                burn = "import time\\nend = time.process_time() + 2.0\\nwhile time.process_time() < end: pass"
                subprocess.run([sys.executable, "-c", burn], check=True)

            def test_idle():
                pass
            """
        )
    )
    out = tmp_path / "cpu.txt"
    harness = __import__("harness").__path__[0]
    code = (
        f"import sys; sys.path.insert(0, {str(harness)!r} + '/..'); import pytest; "
        "from harness.suite_cpu import SuiteCpu; from pathlib import Path; "
        f"plugin = SuiteCpu(Path({str(out)!r})); "
        f"sys.exit(pytest.main([{str(tests)!r}, '-q', '-p', 'no:cacheprovider'], plugins=[plugin]))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = out.read_text().splitlines()
    burned = next(line for line in lines if "test_burn.py" in line)
    assert any("(1 processes" in line for line in lines if "python: other" in line), out.read_text()
    assert float(burned.split()[0].replace(",", "")) >= 0.5, out.read_text()


def test_a_cli_process_is_named_by_its_command_without_options():
    assert command_of("/v/bin/python -m headwater --config h.yaml load --follow --log-format text") == "load"
    assert command_of("/v/bin/python -m headwater run --until-caught-up --config /x.yaml") == "run"
    assert command_of("/v/bin/headwater --config h.yaml feeds run --available-now") == "feeds run"
