"""A Delta table's files wherever the table lives: what Headwater writes and reads beside delta-rs.

Merge-on-read (:mod:`warehouse_loader.delta.merge_on_read`) and Headwater's compaction write
data files, deletion vector files and log entries themselves, and read the log's add actions.
:class:`TableFiles` is that I/O for one table; paths are relative to the table's root,
``/``-separated, as the Delta log spells them. Contract:

* :meth:`~TableFiles.read`, :meth:`~TableFiles.read_at`: a file's bytes (``FileNotFoundError``
  when it is not there).
* :meth:`~TableFiles.output`: a new file written as a stream; whole and durable once the block
  exits (locally fsynced; on S3 the upload completes when the stream closes), removed when the
  block raises. A file is never named by a commit before it is durable.
* :meth:`~TableFiles.create`: put-if-absent of a small file (a log entry ``_delta_log/N.json``):
  True when this call created it, False (nothing written) when the path exists. Of writers
  racing for one path exactly one gets True: what keeps a Delta commit atomic and never
  overwritten, so two writers can never both commit version N.
* :meth:`~TableFiles.listing`, :meth:`~TableFiles.delete`: for maintenance.

Implementations: a local directory (:class:`LocalFiles`: ``link`` from a fsynced staging file,
which fails when the name exists) and S3 (:class:`S3Files`: pyarrow's S3 filesystem for data,
the entry a ``PutObject`` with ``If-None-Match: *`` through boto3, as pyarrow cannot send that
header; S3 answers 412 when the key exists, since 2024). Other stores (``gs://``, ``az://``):
:func:`table_files` is None, and their tables stay copy-on-write (delta-rs's MERGE).
"""

from __future__ import annotations

import os
import posixpath
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from warehouse_loader.location import TableLocation
from warehouse_loader.object_store import S3_SCHEMES, read_fully, retrying, s3_client

#: S3 status codes of a conditional write that lost: the key exists (412), or another
#: conditional write of the key is in flight (409, ``ConditionalRequestConflict``).
_LOST = {"PreconditionFailed": 412, "ConditionalRequestConflict": 409}


class TableFiles(ABC):
    """The files of the table at ``location`` (see the module's contract)."""

    def __init__(self, location: TableLocation) -> None:
        self.location = location
        self.fs, self.root = location.filesystem()

    def path(self, relative: str) -> str:
        """Where ``relative`` is in :attr:`fs`."""
        return posixpath.join(self.root, relative)

    def uri(self, relative: str) -> str:
        """The file's name as delta-rs's file list and DuckDB's ``filename`` give it."""
        return f"{self.location.uri.rstrip('/')}/{relative}"

    def relative(self, uri: str) -> str:
        """A file's :meth:`uri` (as :func:`~warehouse_loader.delta.scan.live_files` decodes it), table-relative."""
        return uri.removeprefix(f"{self.location.uri.rstrip('/')}/")

    def read(self, relative: str) -> bytes:
        """The whole file."""
        where = self.path(relative)

        def whole() -> bytes:
            with self.fs.open_input_stream(where) as stream:
                return bytes(stream.read())

        return retrying(whole, where)

    def read_at(self, relative: str, offset: int, size: int) -> bytes:
        """``size`` bytes of the file from ``offset`` (fewer only at its end)."""
        where = self.path(relative)

        def part() -> bytes:
            with self.fs.open_input_file(where) as handle:
                return read_fully(handle, offset, size)

        return retrying(part, where)

    def parquet(self, relative: str, columns: Sequence[str]) -> pa.Table:
        """``columns`` of the Parquet file."""
        return pq.read_table(self.path(relative), columns=list(columns), filesystem=self.fs)

    def metadata(self, relative: str) -> pq.FileMetaData:
        """The Parquet file's footer."""
        with self.fs.open_input_file(self.path(relative)) as handle:
            return pq.read_metadata(handle)

    @contextmanager
    def output(self, relative: str) -> Iterator[Any]:
        """A new file's output stream; durable once the block exits, gone if it raises."""
        where = self.path(relative)
        self._prepare(where)
        try:
            with self.fs.open_output_stream(where) as stream:
                yield stream
            self._settle(where)
        except BaseException:
            if self._present(where):
                self.fs.delete_file(where)
            raise

    def write(self, relative: str, data: bytes) -> None:
        """Write the file whole (durable on return)."""
        with self.output(relative) as stream:
            stream.write(data)

    def listing(self, directory: str) -> list[pafs.FileInfo]:
        """The files directly in ``directory`` (none when it is not there)."""
        selector = pafs.FileSelector(self.path(directory), allow_not_found=True)
        return [info for info in self.fs.get_file_info(selector) if info.type == pafs.FileType.File]

    def delete(self, relative: str) -> None:
        """Remove the file."""
        self.fs.delete_file(self.path(relative))

    def _present(self, where: str) -> bool:
        return bool(self.fs.get_file_info(where).type != pafs.FileType.NotFound)

    @abstractmethod
    def _prepare(self, where: str) -> None:
        """Make writing ``where`` possible (a local directory)."""

    @abstractmethod
    def _settle(self, where: str) -> None:
        """Make the written file at ``where`` durable."""

    @abstractmethod
    def create(self, relative: str, data: bytes) -> bool:
        """Put-if-absent: True when this call created the file, False when it was there (nothing written)."""


class LocalFiles(TableFiles):
    """A table in a local directory: files fsynced, log entries created with ``link``."""

    def relative(self, uri: str) -> str:
        """As :meth:`TableFiles.relative`, also for a table given by a relative path."""
        return posixpath.relpath(uri, self.location.uri)

    def _prepare(self, where: str) -> None:
        os.makedirs(os.path.dirname(where), exist_ok=True)

    def _settle(self, where: str) -> None:
        with open(where, "rb") as handle:
            os.fsync(handle.fileno())

    def create(self, relative: str, data: bytes) -> bool:
        """Write a fsynced staging file beside ``relative`` and link it there (``link`` fails when the name exists)."""
        final = self.path(relative)
        directory, name = os.path.split(final)
        staged = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        with open(staged, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(staged, final)
        except FileExistsError:
            return False
        finally:
            os.unlink(staged)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return True


class S3Files(TableFiles):
    """A table on S3: files through pyarrow's S3 filesystem, log entries as conditional ``PutObject``."""

    def _prepare(self, where: str) -> None:
        """Nothing: S3 has no directories."""

    def _settle(self, where: str) -> None:
        """Nothing: an object exists only once its upload completed (the stream's close)."""

    def create(self, relative: str, data: bytes) -> bool:
        """``PutObject`` with ``If-None-Match: *``.

        A lost race is 412 (or 409 while the winner's write is in flight). A PUT that landed but
        whose answer was lost is retried by the client and then finds the key: the entry is ours
        when its bytes are (an entry names a fresh ``txnId``), so it is not taken for a loss.
        """
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

        bucket, _, key = self.path(relative).partition("/")
        client = s3_client(tuple(sorted((self.location.storage_options or {}).items())))
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            error, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
            if error.get("Code") not in _LOST and meta.get("HTTPStatusCode") not in _LOST.values():
                msg = f"PUT {self.uri(relative)}: {exc}"
                raise OSError(msg) from None
        except BotoCoreError as exc:  # no answer: the entry may or may not be there; the caller retries the batch
            msg = f"PUT {self.uri(relative)}: {exc}"
            raise OSError(msg) from None
        try:
            return self.read(relative) == data
        except FileNotFoundError:
            return False  # 409: the winner's entry is not visible yet


def table_files(location: TableLocation) -> TableFiles | None:
    """The files of the table at ``location``; None on a store without conditional writes here (gs, az)."""
    if not location.is_remote:
        return LocalFiles(location)
    if location.scheme in S3_SCHEMES:
        return S3Files(location)
    return None
