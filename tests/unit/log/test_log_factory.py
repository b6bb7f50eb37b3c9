from core.config import parse_config
from log.factory import open_log
from log.file.backend import FileLog


def test_file_backend_lives_under_the_home_dir_with_configured_settings(tmp_path):
    config = parse_config(
        {
            "project": "shop",
            "home": str(tmp_path / "state"),
            "log": {"file": {"fsync": "never", "segment_bytes": 4096}},
        },
        tmp_path / "headwater.yaml",
    )
    log = open_log(config)
    try:
        assert isinstance(log, FileLog)
        assert log.root == tmp_path / "state" / "log"
        assert (log._fsync, log._segment_bytes) == (False, 4096)
    finally:
        log.close()


def test_default_backend_is_the_file_log(tmp_path):
    config = parse_config({"project": "shop", "home": str(tmp_path)}, tmp_path / "headwater.yaml")
    log = open_log(config)
    assert isinstance(log, FileLog) and log._fsync
    log.close()


def test_file_log_compression_is_configured_zstd_by_default(tmp_path):
    for given, expected in (({}, "zstd"), ({"compression": "none"}, "none"), ({"compression": "zstd"}, "zstd")):
        config = parse_config(
            {"project": "shop", "home": str(tmp_path), "log": {"file": given}}, tmp_path / "headwater.yaml"
        )
        log = open_log(config)
        assert log.compression == expected
        log.close()


def test_unknown_file_log_compression_is_a_config_error_naming_the_field(tmp_path):
    import pytest

    with pytest.raises(Exception, match=r"log\.file\.compression") as info:
        parse_config({"project": "shop", "log": {"file": {"compression": "gzip"}}}, tmp_path / "headwater.yaml")
    assert "Traceback" not in str(info.value)
