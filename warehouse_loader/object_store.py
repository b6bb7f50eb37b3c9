"""pyarrow filesystems for warehouse tables on object stores, built from delta-rs's storage options.

delta-rs writes and reads a table with its own object store client (``storage_options``
as object_store spells them: ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...). Readers that go
through DuckDB need the same store as a pyarrow filesystem: DuckDB's own S3 support is an
extension (``httpfs``) it would download at run time, so Headwater hands DuckDB the store
as an fsspec filesystem wrapping pyarrow's (:func:`duckdb_filesystem`) and turns
extension auto-installation off.

Keys are matched case-insensitively, with or without object_store's ``aws_`` /
``google_`` / ``azure_storage_`` prefixes. Credentials not given fall back to each SDK's
default chain (environment, config files, instance metadata), as delta-rs's do. Only
``s3://`` is exercised by the tests (moto); ``gs://`` and ``az://`` map the options below
and are otherwise the SDKs' defaults.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import pyarrow.fs as pafs  # type: ignore[import-untyped]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How often a file open or read DuckDB asks of a store is tried before its error fails the
#: query, and the pause before the first retry (doubling). pyarrow's S3 client retries a
#: request itself, yet a loaded machine's store can stay silent past all of those (CI saw a
#: loader's batch fail on one such read); a read is asked again from the same offset.
READ_ATTEMPTS = 4
READ_RETRY_PAUSE_S = 0.5

#: URL schemes per store, as delta-rs accepts them.
S3_SCHEMES = ("s3", "s3a")
GCS_SCHEMES = ("gs", "gcs")
AZURE_SCHEMES = ("az", "abfs", "abfss", "azure")


def _option(options: Mapping[str, str], *names: str) -> str | None:
    lowered = {key.lower(): value for key, value in options.items()}
    for name in names:
        if name in lowered:
            return lowered[name]
    return None


def _seconds(text: str | None) -> float | None:
    """object_store durations (``"5s"``, ``"500ms"``, ``"2m"``) as seconds."""
    if text is None:
        return None
    text = text.strip().lower()
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * factor
    return float(text) if text.replace(".", "", 1).isdigit() else None


def _true(text: str | None) -> bool:
    return text is not None and text.strip().lower() in ("1", "true", "yes")


def arrow_filesystem(scheme: str, options: Mapping[str, str], bucket: str = "") -> pafs.FileSystem:
    """The pyarrow filesystem of store ``scheme`` configured like delta-rs's (paths are ``bucket/key``)."""
    import pyarrow.fs as pafs

    if scheme in S3_SCHEMES:
        return _s3(options)
    if scheme in GCS_SCHEMES:
        endpoint = _option(options, "google_endpoint", "endpoint", "google_cloud_storage_endpoint")
        kwargs: dict[str, Any] = {}
        if endpoint:
            parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs.update(endpoint_override=parts.netloc, scheme=parts.scheme)
        return pafs.GcsFileSystem(
            anonymous=_true(_option(options, "google_skip_signature", "skip_signature")), **kwargs
        )
    if scheme in AZURE_SCHEMES:
        account = (
            _option(options, "azure_storage_account_name", "account_name") or bucket.partition("@")[2].split(".")[0]
        )
        return pafs.AzureFileSystem(
            account,
            account_key=_option(options, "azure_storage_account_key", "azure_storage_access_key", "account_key"),
            sas_token=_option(options, "azure_storage_sas_key", "azure_storage_sas_token", "sas_key", "sas_token"),
            client_id=_option(options, "azure_storage_client_id", "azure_client_id", "client_id"),
            client_secret=_option(options, "azure_storage_client_secret", "azure_client_secret", "client_secret"),
            tenant_id=_option(options, "azure_storage_tenant_id", "azure_tenant_id", "tenant_id"),
        )
    msg = f"no filesystem for {scheme}:// (warehouse.path takes s3://, gs:// or az://)"
    raise ValueError(msg)


def _s3_settings(options: Mapping[str, str]) -> dict[str, Any]:
    """The S3 settings ``options`` give (None where unset), read once for pyarrow's client and boto3's."""
    endpoint = _option(options, "aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")
    retries = _option(options, "max_retries")
    return {
        "access_key": _option(options, "aws_access_key_id", "access_key_id"),
        "secret_key": _option(options, "aws_secret_access_key", "secret_access_key"),
        "session_token": _option(options, "aws_session_token", "session_token", "aws_token", "token"),
        "region": _option(options, "aws_region", "region", "aws_default_region"),
        "connect_timeout": _seconds(_option(options, "connect_timeout")),
        "request_timeout": _seconds(_option(options, "timeout")),
        "virtual": _true(_option(options, "aws_virtual_hosted_style_request")),
        "endpoint": (endpoint if "://" in endpoint else f"https://{endpoint}") if endpoint else None,
        "max_retries": int(retries) if retries is not None and retries.isdigit() else None,
    }


def _s3(options: Mapping[str, str]) -> pafs.S3FileSystem:
    import pyarrow.fs as pafs

    settings = _s3_settings(options)
    kwargs: dict[str, Any] = {
        name: settings[name] for name in ("access_key", "secret_key", "session_token", "region", "connect_timeout")
    }
    kwargs.update(request_timeout=settings["request_timeout"], force_virtual_addressing=settings["virtual"])
    if settings["endpoint"]:
        parts = urlsplit(settings["endpoint"])
        kwargs["endpoint_override"] = parts.netloc
        kwargs["scheme"] = parts.scheme
    if settings["max_retries"] is not None:
        kwargs["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=settings["max_retries"] + 1)
    return pafs.S3FileSystem(**{key: value for key, value in kwargs.items() if value is not None})


@functools.lru_cache(maxsize=16)
def s3_client(options: tuple[tuple[str, str], ...]) -> Any:
    """A boto3 S3 client configured like delta-rs's store (for what pyarrow's cannot send: conditional writes).

    ``options`` as :attr:`~warehouse_loader.location.TableLocation.storage_options` gives them, as
    sorted pairs (cached per set: a client takes ~0.1 s to build and is thread-safe). Path-style
    addressing unless ``aws_virtual_hosted_style_request``, as object_store's default.
    """
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    settings = _s3_settings(dict(options))
    config: dict[str, Any] = {"s3": {"addressing_style": "virtual" if settings["virtual"] else "path"}}
    if settings["connect_timeout"] is not None:
        config["connect_timeout"] = settings["connect_timeout"]
    if settings["request_timeout"] is not None:
        config["read_timeout"] = settings["request_timeout"]
    if settings["max_retries"] is not None:
        config["retries"] = {"total_max_attempts": settings["max_retries"] + 1, "mode": "standard"}
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings["endpoint"],
        aws_access_key_id=settings["access_key"],
        aws_secret_access_key=settings["secret_key"],
        aws_session_token=settings["session_token"],
        region_name=settings["region"],
        config=Config(**config),
    )


def split_uri(uri: str) -> tuple[str, str]:
    """``(scheme, path inside the filesystem)`` of a store URL: ``s3://b/p`` -> ``("s3", "b/p")``.

    ``abfss://container@account.dfs.core.windows.net/p`` -> ``("abfss", "container/p")``.
    """
    scheme, _, rest = uri.partition("://")
    scheme = scheme.lower()
    bucket, _, key = rest.partition("/")
    if scheme in AZURE_SCHEMES:
        bucket = bucket.partition("@")[0]
    return scheme, f"{bucket}/{key}".rstrip("/")


def duckdb_filesystem(scheme: str, options: Mapping[str, str]) -> Any:
    """An fsspec filesystem (what DuckDB's ``register_filesystem`` takes) serving ``<scheme>://`` paths.

    fsspec comes with the project's dependencies (universal-pathlib via Dagster).
    """
    from fsspec.implementations.arrow import ArrowFile, ArrowFSWrapper  # type: ignore[import-untyped]

    family = next(f for f in (S3_SCHEMES, GCS_SCHEMES, AZURE_SCHEMES) if scheme in f)

    class WholeReads(ArrowFile):  # type: ignore[misc]
        """A store file as DuckDB reads it: a position per thread, each read whole at its offset.

        DuckDB reads a Python file at an offset as two calls, ``seek()`` then ``read()``, each
        taking the GIL on its own, and its threads share the one file object of a file: another
        thread's seek between them made a read return the wrong bytes or too few ("ZSTD
        Decompression failure", "Failed to read 2097152 bytes ... only 1628650 bytes returned",
        both in CI on S3; every query of a 20-row-group file with 4 threads in the unit test).
        So each thread keeps its own position, and a read is pyarrow's ``read_at`` there.
        """

        #: This thread's ``position`` (none yet: 0); set where an opened file becomes one of these.
        _thread: threading.local

        def seek(self, offset: int, whence: int = 0) -> int:
            base = {0: 0, 1: self.tell(), 2: int(self.stream.size())}[whence]
            position = base + offset
            self._thread.position = position
            return position

        def tell(self) -> int:
            return int(getattr(self._thread, "position", 0))

        def read(self, length: int = -1) -> bytes:
            at = self.tell()
            left = max(0, self.stream.size() - at)
            wanted = left if length is None or length < 0 else min(length, left)
            data = retrying(lambda: read_fully(self.stream, at, wanted), f"reading {self.path} at {at}")
            self.seek(at + len(data))
            return data

    class StoreFileSystem(ArrowFSWrapper):  # type: ignore[misc]
        protocol = family  # DuckDB routes a path to the filesystem whose protocol its scheme is

        def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
            if mode != "rb":
                return super()._open(path, mode, *args, **kwargs)
            opened = retrying(lambda: super(StoreFileSystem, self)._open(path, mode, *args, **kwargs), str(path))
            opened.__class__ = WholeReads  # the same file (a second wrapper would close the stream when collected)
            opened._thread = threading.local()
            return opened

        @classmethod
        def _strip_protocol(cls, path: Any) -> Any:
            if isinstance(path, list):
                return [cls._strip_protocol(item) for item in path]
            return split_uri(path)[1] if "://" in str(path) else path

    return StoreFileSystem(arrow_filesystem(scheme, options))


def read_fully(stream: Any, offset: int, length: int) -> bytes:
    """``length`` bytes of ``stream`` from ``offset`` (fewer only at its end), by positional reads.

    A store may return fewer bytes than asked before the end (a ranged read cut short), and
    DuckDB takes any short read from a Python filesystem for an error, so this reads on.
    """
    parts: list[bytes] = []
    got = 0
    while got < length:
        more: bytes = stream.read_at(length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def retrying(call: Callable[[], _T], what: str) -> _T:
    """``call()``, tried again after an ``OSError`` (not a missing file): :data:`READ_ATTEMPTS` times in all."""
    attempts = READ_ATTEMPTS
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except FileNotFoundError:
            raise
        except OSError as exc:
            if attempt == attempts:
                raise
            logger.warning("object store: %s failed (%s); trying again (%d of %d)", what, exc, attempt + 1, attempts)
            time.sleep(READ_RETRY_PAUSE_S * 2 ** (attempt - 1))
    raise AssertionError  # unreachable: the last attempt returns or raises
