"""spark_log.cluster: the checks before a session on a cluster (no JVM, no cluster needed)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from core.config import parse_config
from core.errors import ConfigError
from operations.embedded_postgres import free_port
from spark_log.cluster import check_before_session, is_loopback, master_addresses
from spark_log.errors import SparkMasterUnreachableError


def config(tmp_path: Path, **sections: object):
    return parse_config({"project": "p", **sections}, tmp_path / "headwater.yaml")


def test_master_addresses_and_loopback() -> None:
    assert master_addresses("spark://10.0.0.1:7077,10.0.0.2:7078") == [("10.0.0.1", 7077), ("10.0.0.2", 7078)]
    assert master_addresses("k8s://https://api.example:6443") == [("api.example", 6443)]
    assert master_addresses("k8s://api.example") == [("api.example", 443)]
    assert master_addresses("yarn") == master_addresses("local[2]") == []
    assert is_loopback("local[2]") and is_loopback("spark://127.0.0.1:7077") and is_loopback("spark://localhost:1")
    assert not is_loopback("spark://10.0.0.1:7077") and not is_loopback("yarn")


def test_local_master_needs_nothing(tmp_path: Path) -> None:
    check_before_session(config(tmp_path))


def test_a_file_log_with_a_remote_master_is_refused_unless_shared(tmp_path: Path) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        master = f"spark://127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(ConfigError, match=r"log\.file\.shared: the file log in .* is on this host") as caught:
            check_before_session(config(tmp_path, spark={"master": master}))
        assert "\n" not in str(caught.value) and "log.backend: kafka" in str(caught.value)
        check_before_session(config(tmp_path, spark={"master": master}, log={"file": {"shared": True}}))
        check_before_session(config(tmp_path, spark={"master": master}, log={"backend": "kafka"}))


def test_an_unreachable_master_fails_in_seconds(tmp_path: Path) -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(SparkMasterUnreachableError, match=f"cannot reach the Spark master spark://127.0.0.1:{port}"):
        check_before_session(config(tmp_path, spark={"master": f"spark://127.0.0.1:{port}"}, log={"backend": "kafka"}))
    assert time.monotonic() - started < 5


def test_yarn_needs_its_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    with pytest.raises(ConfigError, match="yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR"):
        check_before_session(config(tmp_path, spark={"master": "yarn"}, log={"backend": "kafka"}))
