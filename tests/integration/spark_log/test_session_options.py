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


@pytest.mark.parametrize("quieted", [True, False])
@pytest.mark.parametrize("hang_up", ["close", "reset", "pipe"])
def test_a_jvm_hanging_up_on_the_accumulator_server_prints_no_traceback(quieted, hang_up, tmp_path, capfd):
    """The JVM closing its accumulator connection (it stops, or is gone) is not an error to print.

    Seen as a traceback in ``run --follow``'s output when a stop came during a feed's first
    micro-batch (``EOFError``), and when a SIGTERM came at a load's first micro-batch
    (``ConnectionResetError``: the JVM exited with the server's acknowledgement of its last
    updates unread; ``BrokenPipeError``: it exited before the server wrote that acknowledgement,
    seen in CI at the same moment). pyspark's own server (as every session here starts it: a Unix socket), hung
    up on as the JVM would; unquieted, it prints the traceback (so the check can fail).
    """
    import socket
    import struct
    import time

    from pyspark.accumulators import _start_update_server

    from spark_log.session import quiet_accumulator_hangups

    # "pipe": the server's acknowledgement races the close; mostly it comes after (the write
    # fails), rarely before (the next read is reset, as in "reset"). Either is a hang-up.
    errors = {
        "close": ("EOFError",),
        "reset": ("ConnectionResetError",),
        "pipe": ("BrokenPipeError", "ConnectionResetError"),
    }
    error = errors[hang_up]
    server = _start_update_server("", True, str(tmp_path / "accumulators.sock"))
    try:
        if quieted:
            quiet_accumulator_hangups(server)
        capfd.readouterr()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(server.server_address)
            if hang_up == "reset":
                connection.sendall(struct.pack("!i", 0))  # no updates: the server acknowledges with one byte
                connection.settimeout(10)
                assert connection.recv(1, socket.MSG_PEEK) == b"\x01"  # left unread: closing resets
            elif hang_up == "pipe":
                connection.sendall(struct.pack("!i", 0))  # closed before the server's acknowledgement
        deadline = time.monotonic() + 5
        err = ""
        while time.monotonic() < deadline and not any(name in err for name in error):
            time.sleep(0.2)  # the handler polls once a second and reads the hang-up on the next poll
            err += capfd.readouterr().err
    finally:
        server.shutdown()
    assert any(name in err for name in error) is not quieted, err
