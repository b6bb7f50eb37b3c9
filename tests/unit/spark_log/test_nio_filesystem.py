"""The jar of the session's local file system: built once per environment by the JDK's javac, or none.

What the class does inside a JVM is tests/integration/spark_log/test_checkpoint_spawns.py's.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from spark_log import session
from spark_log.nio_filesystem import FILE_SYSTEM_CLASS, nio_filesystem_jar


def test_without_a_javac_there_is_no_jar_and_the_session_keeps_hadoops_class(tmp_path: Path) -> None:
    jre = tmp_path / "jre" / "bin"
    jre.mkdir(parents=True)
    (jre / "java").write_text("")
    assert nio_filesystem_jar(None, tmp_path / "cache") is None
    assert nio_filesystem_jar(jre / "java", tmp_path / "cache") is None
    assert not (tmp_path / "cache").exists()


def test_a_build_that_failed_is_not_tried_again(tmp_path: Path) -> None:
    jdk = tmp_path / "jdk" / "bin"
    jdk.mkdir(parents=True)
    (jdk / "java").write_text("")
    runs = tmp_path / "runs"
    (jdk / "javac").write_text(f"#!/bin/sh\necho run >> {runs}\nexit 1\n")
    (jdk / "javac").chmod(0o755)
    assert nio_filesystem_jar(jdk / "java", tmp_path / "cache") is None
    assert nio_filesystem_jar(jdk / "java", tmp_path / "cache") is None
    assert runs.read_text() == "run\n"  # once
    assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".failed"]


def test_only_a_local_master_s_sessions_get_the_class() -> None:
    """Executors in JVMs of their own would not have the jar."""
    assert session._local_filesystem_class_path("spark://127.0.0.1:7077") == ""
    assert session._local_filesystem_class_path("local-cluster[2,1,1024]") == ""
    java = session._java_binary()
    if java is not None and java.with_name("javac").is_file():
        for master in ("local", "local[2]", "local[*]"):
            assert session._local_filesystem_class_path(master).endswith(".jar"), master


def test_the_jdk_builds_the_jar_once(tmp_path: Path) -> None:
    java = session._java_binary()
    if java is None or not java.with_name("javac").is_file():
        pytest.skip("no JDK (javac) beside the java Spark runs on")
    jar = nio_filesystem_jar(java, tmp_path)
    assert jar is not None and jar.parent == tmp_path
    with zipfile.ZipFile(jar) as archive:
        names = set(archive.namelist())
    assert f"{FILE_SYSTEM_CLASS.replace('.', '/')}.class" in names
    assert f"{FILE_SYSTEM_CLASS.replace('.', '/')}$Raw.class" in names
    built = jar.stat().st_mtime_ns
    assert nio_filesystem_jar(java, tmp_path) == jar
    assert jar.stat().st_mtime_ns == built  # found, not built again
    assert [p.name for p in tmp_path.iterdir()] == [jar.name]  # no build leftovers
