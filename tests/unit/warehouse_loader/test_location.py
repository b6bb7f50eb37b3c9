"""TableLocation (one type for local and object store tables) and the object store mappings."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from core.config import parse_config
from warehouse_loader.delta.table import delta_exists, open_delta
from warehouse_loader.errors import WarehouseStorageError, WarehouseUnreachableError
from warehouse_loader.location import FAIL_FAST_OPTIONS, TableLocation, as_location, location_in, storage_error
from warehouse_loader.object_store import _seconds, arrow_filesystem, split_uri


def test_local_location_behaves_like_the_path_it_was(tmp_path: Path) -> None:
    location = as_location(tmp_path / "orders.v2")
    assert str(location) == str(tmp_path / "orders.v2") and location.name == "orders.v2"
    assert not location.is_remote and location.storage_options is None and location.path == tmp_path / "orders.v2"
    side = location / "_hw_tombstones"
    assert side.path == tmp_path / "orders.v2" / "_hw_tombstones"
    assert not delta_exists(location) and open_delta(location) is None
    write_deltalake(location.uri, pa.table({"a": [1]}))
    assert delta_exists(location) and open_delta(location).version() == 0
    location.remove()
    assert not location.path.exists()


def test_remote_location_carries_options_but_never_shows_them(tmp_path: Path) -> None:
    config = parse_config(
        {
            "project": "p",
            "warehouse": {"path": "s3://b/wh", "storage_options": {"AWS_SECRET_ACCESS_KEY": "sek", "timeout": "9s"}},
        },
        tmp_path / "headwater.yaml",
    )
    location = location_in(config, f"{config.warehouse_root}/orders")
    assert location.is_remote and location.scheme == "s3" and location.name == "orders"
    assert "sek" not in repr(location) and "sek" not in str(location)
    options = location.storage_options
    assert options is not None and options["AWS_SECRET_ACCESS_KEY"] == "sek" and options["timeout"] == "9s"
    assert all(options[k] == v for k, v in FAIL_FAST_OPTIONS.items())  # given options win, the rest fail fast
    assert (location / "_hw_tombstones").storage_options == options
    with pytest.raises(ValueError, match="object store"):
        _ = location.path
    assert location_in(config, str(tmp_path / "t")).storage_options is None


def test_store_paths_and_durations() -> None:
    assert split_uri("s3://bucket/a/b/") == ("s3", "bucket/a/b")
    assert split_uri("abfss://box@acct.dfs.core.windows.net/wh/t") == ("abfss", "box/wh/t")
    assert _seconds("5s") == 5.0 and _seconds("500ms") == 0.5 and _seconds("2m") == 120.0 and _seconds("7") == 7.0
    assert _seconds(None) is None and _seconds("soon") is None


def test_s3_filesystem_follows_delta_rs_option_names() -> None:
    fs = arrow_filesystem(
        "s3",
        {
            "aws_endpoint_url": "http://127.0.0.1:9000",
            "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_REGION": "eu-west-1",
        },
    )
    assert fs.type_name == "s3" and fs.region == "eu-west-1"
    with pytest.raises(ValueError, match="no filesystem for hdfs://"):
        arrow_filesystem("hdfs", {})


# Texts as delta-rs and pyarrow raise them (measured against moto; ANSI colour codes included).
MISSING = (
    "Generic S3 error\n \x1b[31m↳\x1b[0m Error performing list request\n \x1b[31m↳\x1b[0m 404 Not Found\n"
    " \x1b[31m↳\x1b[0m <Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>"
)
REFUSED = (
    "Generic S3 error\n \x1b[31m↳\x1b[0m 403 Forbidden\n \x1b[31m↳\x1b[0m <Error><Code>InvalidAccessKeyId</Code>"
    "<Message>The AWS Access Key Id you provided does not exist in our records.</Message>"
)
REFUSED_ARROW = (
    "When listing objects under key 'wh/' in bucket 'b': AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2"
)
DOWN = (
    "Generic S3 error\n \x1b[31m↳\x1b[0m Error performing GET http://127.0.0.1:40363/b?list-type=2 in 263ms, after 2 "
    "retries\n \x1b[31m↳\x1b[0m client error (Connect)\n \x1b[31m↳\x1b[0m tcp connect error\n Connection refused"
)


@pytest.mark.parametrize(
    ("text", "kind", "words"),
    [
        (MISSING, WarehouseStorageError, "bucket 'b' does not exist; create it or fix warehouse.path"),
        (REFUSED, WarehouseStorageError, "refused the credentials (InvalidAccessKeyId)"),
        (REFUSED_ARROW, WarehouseStorageError, "refused the credentials (INVALID_ACCESS_KEY_ID)"),
        (DOWN, WarehouseUnreachableError, "cannot reach the object store at http://127.0.0.1:40363"),
        ("something else", WarehouseStorageError, "warehouse s3://b/wh: something else"),
    ],
)
def test_storage_errors_are_one_line_saying_what_to_fix(text: str, kind: type, words: str) -> None:
    error = storage_error(OSError(text), TableLocation("s3://b/wh"))
    assert isinstance(error, kind) and words in str(error)
    assert "\n" not in str(error) and "\x1b" not in str(error)
