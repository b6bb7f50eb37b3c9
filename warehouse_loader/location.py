"""Where a warehouse table lives: one type for a local directory and an object store prefix, for every format.

:class:`TableLocation` is what every reader and writer of a table takes: its URL (an
absolute local path, or ``s3://bucket/prefix/<table>``, ``gs://...``, ``az://...``) and the
warehouse's storage options. ``str(location)`` is the URL (never a credential); a format's
own client gets :attr:`~TableLocation.storage_options` (delta-rs: as they are), DuckDB and
pyarrow a filesystem built from the same options (:mod:`warehouse_loader.object_store`).
Whether a table is there, and of which format, is the format's to say
(:meth:`warehouse_loader.table_format.TableFormat.exists`).

Object store errors become one line saying what to fix (:func:`storage_error`).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.config import ProjectConfig
from core.deployment import reveal
from core.errors import HeadwaterError, traceback_error_line
from warehouse_loader.errors import WarehouseStorageError, WarehouseUnreachableError
from warehouse_loader.object_store import arrow_filesystem, split_uri

if TYPE_CHECKING:
    import pyarrow.fs as pafs  # type: ignore[import-untyped]

#: object_store's defaults retry a silent endpoint for minutes (30 s per request, 10 retries,
#: 180 s in all); a loader should fail in seconds and let its supervisor retry. Given options win.
FAIL_FAST_OPTIONS = {"connect_timeout": "5s", "max_retries": "3", "retry_timeout": "30s"}


@dataclass(frozen=True, slots=True)
class TableLocation:
    """A table's place: ``uri`` (local absolute path or store URL) and the store's options."""

    uri: str
    options: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)

    def __str__(self) -> str:
        return self.uri

    @property
    def scheme(self) -> str:
        """The store's URL scheme (``s3``, ``gs``, ``az`` ...), ``""`` for a local path."""
        return self.uri.partition("://")[0].lower() if "://" in self.uri else ""

    @property
    def is_remote(self) -> bool:
        """True on an object store."""
        return bool(self.scheme)

    @property
    def name(self) -> str:
        """The last segment (a table's build name, ``orders`` or ``orders.v2``)."""
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    def __truediv__(self, child: str) -> TableLocation:
        return TableLocation(f"{self.uri.rstrip('/')}/{child}", self.options)

    @property
    def path(self) -> Path:
        """The local directory (only for a local location)."""
        if self.is_remote:
            msg = f"{self.uri} is on an object store, not a local path"
            raise ValueError(msg)
        return Path(self.uri)

    @property
    def storage_options(self) -> dict[str, str] | None:
        """What a format's store client takes: None locally; the store's options with fail-fast retry settings."""
        if not self.is_remote:
            return None
        given = dict(self.options)
        lowered = {key.lower() for key in given}
        return {**{k: v for k, v in FAIL_FAST_OPTIONS.items() if k not in lowered}, **given}

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem holding the table and the table's path in it."""
        if not self.is_remote:
            import pyarrow.fs as pafs

            return pafs.LocalFileSystem(), self.uri
        scheme, inside = split_uri(self.uri)
        return arrow_filesystem(scheme, self.storage_options or {}, self.uri.partition("://")[2].split("/")[0]), inside

    def remove(self) -> None:
        """Delete the table and everything under its location (a no-op when nothing is there)."""
        if not self.is_remote:
            shutil.rmtree(self.uri, ignore_errors=True)
            return
        import pyarrow.fs as pafs

        fs, inside = self.filesystem()
        try:
            if fs.get_file_info(inside).type != pafs.FileType.NotFound:
                fs.delete_dir(inside)
        except OSError as exc:
            raise storage_error(exc, self) from None


def as_location(where: TableLocation | str | os.PathLike[str]) -> TableLocation:
    """``where`` as a location: a local path or URL without options stays as it is given."""
    if isinstance(where, TableLocation):
        return where
    text = os.fspath(where)
    return TableLocation(text if "://" in text else str(Path(text)))


def location_in(config: ProjectConfig, target: str) -> TableLocation:
    """The location of ``target`` (a table's path or URL) with the warehouse's storage options."""
    options = tuple(sorted(reveal(config.warehouse.storage_options).items())) if "://" in target else ()
    return TableLocation(target, options)


def warehouse_location(config: ProjectConfig) -> TableLocation:
    """The warehouse's root (``warehouse.path``, default ``<home>/warehouse``)."""
    return location_in(config, config.warehouse_root)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CODE = re.compile(r"<Code>([^<]+)</Code>|AWS Error ([A-Z_]+)")
_MISSING = ("NoSuchBucket", "NO_SUCH_BUCKET", "ContainerNotFound", "The specified bucket does not exist")
_REFUSED = (
    "InvalidAccessKeyId",
    "INVALID_ACCESS_KEY_ID",
    "SignatureDoesNotMatch",
    "SIGNATURE_DOES_NOT_MATCH",
    "AccessDenied",
    "ACCESS_DENIED",
    "403 Forbidden",
    "401 Unauthorized",
    "lacked the necessary privileges",
    "AuthenticationFailed",
    "ExpiredToken",
)
_UNREACHABLE = (
    "Connection refused",
    "tcp connect error",
    "timed out",
    "Timeout was reached",
    "dns error",
    "NETWORK_CONNECTION",
    "(Connect)",
    "Could not connect to the endpoint URL",  # botocore (merge-on-read commits on S3)
    "timeout on endpoint URL",
)


def _error_text(exc: BaseException) -> str:
    """The error's text on one line (a Python traceback, DuckDB's report of a filesystem's error: its error line)."""
    text = _ANSI.sub("", str(exc))
    return " ".join((traceback_error_line(text) or text).replace("↳", " ").split())


def storage_error(exc: BaseException, location: TableLocation | str) -> HeadwaterError:
    """An object store failure as one line naming the store and what to do (unrecognised: permanent)."""
    known = classify_storage_error(exc, location)
    if known is not None:
        return known
    text = _error_text(exc)
    return WarehouseStorageError(f"warehouse {location}: {text[:300]}")


def classify_storage_error(exc: BaseException, location: TableLocation | str) -> HeadwaterError | None:
    """A missing bucket, refused credentials or an unreachable store as one line; None for anything else."""
    text = _error_text(exc)
    where = str(location)
    bucket = where.partition("://")[2].split("/")[0] if "://" in where else where
    codes = [a or b for a, b in _CODE.findall(text)]
    code = codes[0] if codes else ""
    if any(marker in text for marker in _MISSING):
        return WarehouseStorageError(
            f"warehouse {where}: bucket {bucket!r} does not exist; create it or fix warehouse.path in headwater.yaml"
        )
    if any(marker in text for marker in _REFUSED):
        return WarehouseStorageError(
            f"warehouse {where}: the object store refused the credentials ({code or 'access denied'}); "
            "check the keys in warehouse.storage_options (or the environment) and the bucket's permissions"
        )
    if any(marker in text for marker in _UNREACHABLE):
        endpoint = re.search(r"https?://[^/\s]+", text)
        at = f" at {endpoint.group(0)}" if endpoint else ""
        return WarehouseUnreachableError(
            f"warehouse {where}: cannot reach the object store{at} ({text[:160]}); "
            "check warehouse.storage_options (endpoint, region) and the network"
        )
    return None
