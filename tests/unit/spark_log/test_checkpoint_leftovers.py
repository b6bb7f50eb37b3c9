"""Leftovers of a streaming query killed before its first offset entry, and nothing else, are removed."""

from __future__ import annotations

from pathlib import Path

from spark_log.checkpoint_leftovers import drop_first_batch_leftovers

TEMPORARY = ".0.0c2d6f4e-7a51-4b8e-9d3f-1f2a3b4c5d6e.tmp"


def checkpoint(root: Path, *, entries: tuple[str, ...] = ()) -> Path:
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text('{"id":"q"}\n')
    for name in (TEMPORARY, f".{TEMPORARY}.crc", *entries):
        (root / "offsets" / name).write_text("v1\n")
    (root / "commits" / TEMPORARY).write_text("v1\n")
    return root


def test_a_checkpoint_without_a_first_offset_entry_loses_its_temporary_files(tmp_path: Path) -> None:
    root = checkpoint(tmp_path / "cp")
    removed = drop_first_batch_leftovers(root)
    assert sorted(p.name for p in removed) == sorted([TEMPORARY, f".{TEMPORARY}.crc", TEMPORARY])
    assert list((root / "offsets").iterdir()) == [] and list((root / "commits").iterdir()) == []
    assert (root / "metadata").exists()


def test_a_checkpoint_with_an_offset_entry_is_left_alone(tmp_path: Path) -> None:
    root = checkpoint(tmp_path / "cp", entries=("0", ".0.crc"))
    assert drop_first_batch_leftovers(root) == []
    assert {p.name for p in (root / "offsets").iterdir()} == {"0", ".0.crc", TEMPORARY, f".{TEMPORARY}.crc"}


def test_a_missing_checkpoint_is_left_alone(tmp_path: Path) -> None:
    assert drop_first_batch_leftovers(tmp_path / "never-started") == []
