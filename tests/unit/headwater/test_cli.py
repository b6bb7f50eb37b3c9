import subprocess
import sys

import orjson

from headwater import __version__


def headwater(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_version(tmp_path):
    result = headwater("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert __version__ in result.stdout


def test_init_then_source_list(tmp_path):
    assert headwater("init", cwd=tmp_path).returncode == 0
    listed = headwater("source", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "no sources registered" in listed.stdout
    as_json = headwater("source", "list", "--json", cwd=tmp_path)
    assert orjson.loads(as_json.stdout) == []


def test_bad_backend_one_line_error_exit_nonzero(tmp_path):
    (tmp_path / "headwater.yaml").write_text("project: p\nlog:\n  backend: carrier-pigeon\n")
    result = headwater("source", "list", cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "log.backend" in lines[0]
    assert "Traceback" not in result.stderr


def test_debug_shows_traceback(tmp_path):
    (tmp_path / "headwater.yaml").write_text("project: p\nlog:\n  backend: carrier-pigeon\n")
    result = headwater("--debug", "source", "list", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr


def test_config_option_after_subcommand(tmp_path):
    (tmp_path / "sub").mkdir()
    assert headwater("init", "sub", cwd=tmp_path).returncode == 0
    result = headwater("source", "list", "--config", "sub/headwater.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_source_list_masks_password(tmp_path):
    (tmp_path / "headwater.yaml").write_text(
        "project: p\nsources:\n  shop:\n    dsn: postgresql://cap:hunter2@db:5432/shop\n    tables: [public.t]\n"
    )
    for args in (("source", "list"), ("source", "list", "--json")):
        result = headwater(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "hunter2" not in result.stdout + result.stderr
        assert "cap:***@db:5432/shop" in result.stdout
