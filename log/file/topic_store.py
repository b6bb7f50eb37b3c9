"""Topic directories of the file backend: ``<root>/<topic>/topic.json`` plus one directory per partition.

A topic appears atomically: it is built under a temporary name that no legal topic
name can take (``+creating-...``) and renamed into place, so a concurrent reader sees
either no topic or a whole one; two processes creating the same topic race on the
rename and exactly one wins.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from dataclasses import asdict
from pathlib import Path

import orjson

from core.durable_files import fsync_directory
from log.base import TopicSpec
from log.errors import InvalidTopicNameError, UnknownTopicError
from log.file.partition_segments import create_partition_directory
from log.topics import validate_topic_name

SPEC_NAME = "topic.json"
_TEMP_PREFIX = "+"


def topic_directory(root: Path, name: str) -> Path:
    """Where ``name`` lives (the name is validated, so it is a safe path component)."""
    return root / validate_topic_name(name, internal=True)


def partition_directory(topic_dir: Path, partition: int) -> Path:
    """The directory of one partition of a topic."""
    return topic_dir / str(partition)


def encode_spec(spec: TopicSpec) -> bytes:
    """Serialise a topic spec for ``topic.json``."""
    raw = asdict(spec)
    raw["config"] = dict(spec.config)
    return orjson.dumps(raw, option=orjson.OPT_INDENT_2)


def decode_spec(data: bytes) -> TopicSpec:
    """Inverse of :func:`encode_spec`."""
    return TopicSpec(**orjson.loads(data))


def read_spec(root: Path, name: str) -> TopicSpec:
    """The spec of topic ``name``; :class:`UnknownTopicError` if it does not exist."""
    try:
        return decode_spec((topic_directory(root, name) / SPEC_NAME).read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        raise UnknownTopicError(name) from None


def create_topic_directory(root: Path, spec: TopicSpec) -> bool:
    """Create the topic atomically; ``False`` if it already existed."""
    target = topic_directory(root, spec.name)
    if spec.partitions < 1:
        raise InvalidTopicNameError(spec.name, f"a topic needs at least one partition, not {spec.partitions}")
    if target.exists():
        return False
    temp = root / f"{_TEMP_PREFIX}creating-{uuid.uuid4().hex}"
    temp.mkdir()
    try:
        with open(temp / SPEC_NAME, "wb") as fh:
            fh.write(encode_spec(spec))
            fh.flush()
            os.fsync(fh.fileno())
        for partition in range(spec.partitions):
            create_partition_directory(partition_directory(temp, partition))
            fsync_directory(partition_directory(temp, partition))
        fsync_directory(temp)
        try:
            os.rename(temp, target)
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)
    fsync_directory(root)
    return True


def delete_topic_directory(root: Path, name: str) -> None:
    """Remove a topic: renamed out of sight first, so readers never see half of it."""
    source = topic_directory(root, name)
    doomed = root / f"{_TEMP_PREFIX}deleting-{uuid.uuid4().hex}"
    try:
        os.rename(source, doomed)
    except FileNotFoundError:
        raise UnknownTopicError(name) from None
    fsync_directory(root)
    shutil.rmtree(doomed, ignore_errors=True)


def list_topic_names(root: Path) -> list[str]:
    """Names of every complete topic under ``root``, sorted."""
    names = []
    for entry in os.scandir(root):
        if entry.name.startswith(_TEMP_PREFIX) or not entry.is_dir():
            continue
        if os.path.exists(os.path.join(entry.path, SPEC_NAME)):
            names.append(entry.name)
    return sorted(names)
