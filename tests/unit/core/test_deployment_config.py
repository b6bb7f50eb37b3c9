"""``spark:`` and ``warehouse.path``/``storage_options`` in headwater.yaml: defaults, validation, masking."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import parse_config
from core.deployment import shown_settings
from core.errors import ConfigError


def config(tmp_path: Path, **sections: object):
    return parse_config({"project": "p", **sections}, tmp_path / "headwater.yaml", env={"S3_SECRET": "sekr1t-value"})


def test_defaults_stay_local_and_under_home(tmp_path: Path) -> None:
    loaded = config(tmp_path)
    assert loaded.spark.master == "local[2]" and loaded.spark.is_local and loaded.spark.driver_memory == "1g"
    assert loaded.checkpoint_dir == tmp_path / ".headwater" / "checkpoints"
    assert loaded.warehouse_root == str(tmp_path / ".headwater" / "warehouse")


@pytest.mark.parametrize(
    ("memory", "expected"), [("1g", 2**30), ("512m", 512 * 2**20), ("4G", 4 * 2**30), ("2048k", 2**21), ("1000", 1000)]
)
def test_driver_memory_in_bytes_as_the_jvm_reads_it(tmp_path: Path, memory: str, expected: int) -> None:
    assert config(tmp_path, spark={"driver_memory": memory}).spark.driver_memory_bytes == expected


@pytest.mark.parametrize(
    "master",
    ["local", "local[4]", "local[*]", "spark://10.0.0.5:7077", "spark://a:7077,b:7077", "yarn", "k8s://https://k:6443"],
)
def test_masters_spark_accepts(tmp_path: Path, master: str) -> None:
    assert config(tmp_path, spark={"master": master}).spark.master == master


@pytest.mark.parametrize(
    ("spark", "message"),
    [
        ({"master": "mesos://x:5050"}, "spark.master: must be local[N], spark://host:port, yarn or k8s://"),
        ({"master": "spark://nohostport"}, "spark.master: must be"),
        ({"driver_memory": "lots"}, "spark.driver_memory: must be a JVM memory size"),
        ({"conf": {"spark.master": "yarn"}}, "spark.conf: spark.master: set spark.master instead"),
        ({"conf": {"spark.driver.memory": "2g"}}, "set spark.driver_memory instead"),
        ({"conf": {"executor.memory": "2g"}}, "is not a Spark setting"),
        ({"remote": "sc://h:15002"}, "Spark Connect is not supported"),
        ({"conf": {"spark.remote": "sc://h"}}, "Spark Connect is not supported"),
        ({"checkpoints": "/x"}, "spark.checkpoints: unknown key"),
    ],
)
def test_bad_spark_sections_name_the_field(tmp_path: Path, spark: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=r"headwater\.yaml: ") as caught:
        config(tmp_path, spark=spark)
    assert message in str(caught.value)


def test_conf_values_are_text_and_secret(tmp_path: Path) -> None:
    loaded = config(
        tmp_path,
        spark={
            "conf": {
                "spark.executor.cores": 2,
                "spark.speculation": True,
                "spark.hadoop.fs.s3a.secret.key": "${S3_SECRET}",
            }
        },
    )
    assert loaded.spark.session_conf() == {
        "spark.executor.cores": "2",
        "spark.speculation": "true",
        "spark.hadoop.fs.s3a.secret.key": "sekr1t-value",
    }
    assert "sekr1t-value" not in repr(loaded)
    assert shown_settings(loaded.spark.conf)["spark.hadoop.fs.s3a.secret.key"] == "***"
    assert shown_settings(loaded.spark.conf)["spark.executor.cores"] == "2"


def test_warehouse_on_object_storage(tmp_path: Path) -> None:
    options = {"AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "${S3_SECRET}"}
    loaded = config(tmp_path, warehouse={"path": "s3://bucket/some/prefix/", "storage_options": options})
    assert loaded.warehouse_root == "s3://bucket/some/prefix"
    assert "sekr1t-value" not in repr(loaded) and "AKIA1" not in repr(loaded)
    assert shown_settings(loaded.warehouse.storage_options) == {
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "***",
        "AWS_SECRET_ACCESS_KEY": "***",
    }


@pytest.mark.parametrize(
    ("path", "root"),
    [("gs://b/wh", "gs://b/wh"), ("az://container/wh", "az://container/wh"), ("file:///data/wh", "/data/wh")],
)
def test_other_warehouse_locations(tmp_path: Path, path: str, root: str) -> None:
    assert config(tmp_path, warehouse={"path": path}).warehouse_root == root


def test_relative_paths_resolve_beside_the_config_file(tmp_path: Path) -> None:
    loaded = config(tmp_path, warehouse={"path": "lake"}, spark={"checkpoint_path": "shared/ckpt"})
    assert loaded.warehouse_root == str(tmp_path / "lake")
    assert loaded.checkpoint_dir == tmp_path / "shared" / "ckpt"


@pytest.mark.parametrize("path", ["hdfs://nn/wh", "s3://", "ftp://x/y"])
def test_unknown_warehouse_stores_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(ConfigError, match=r"warehouse\.path: must be a local path or s3://bucket/prefix"):
        config(tmp_path, warehouse={"path": path})


def test_shared_file_log_flag(tmp_path: Path) -> None:
    assert config(tmp_path, log={"file": {"shared": True}}).log.file.shared
    assert not config(tmp_path).log.file.shared
