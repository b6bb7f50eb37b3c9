"""S3 for warehouse tests: buckets and delta-rs storage options on :class:`harness.broker.MotoS3`.

One ``moto_server`` serves tansu's bucket and any warehouse bucket (buckets are
independent). moto accepts any credentials unless started with
``INITIAL_NO_AUTH_ACTION_COUNT=0``: :class:`StrictMotoS3` is such a server, where every key
is unknown, for the wrong-credentials case.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator

from harness.broker import MotoS3, moto_server_binary, persistent_broker_unavailable
from harness.processes import die_with_parent

__all__ = ["StrictMotoS3", "create_bucket", "moto_unavailable", "serve", "warehouse_options"]


def moto_unavailable() -> str | None:
    """Why no S3 service can run here (the missing binary, named), or None."""
    return persistent_broker_unavailable() if moto_server_binary() is None else None


def serve(bucket: str) -> Iterator[MotoS3]:
    """A module fixture's body: a started server holding ``bucket``, stopped after (skips without moto_server)."""
    import pytest

    missing = moto_unavailable()
    if missing:
        pytest.skip(missing)
    server = MotoS3().start()
    create_bucket(server, bucket)
    try:
        yield server
    finally:
        server.stop()


def create_bucket(moto: MotoS3, bucket: str) -> str:
    """Create ``bucket`` (3-63 characters) and return ``s3://<bucket>``."""
    request = urllib.request.Request(f"{moto.endpoint}/{bucket}", method="PUT")
    with urllib.request.urlopen(request, timeout=10):
        return f"s3://{bucket}"


def warehouse_options(moto: MotoS3, **overrides: str) -> dict[str, str]:
    """``warehouse.storage_options`` for the server (object_store's names, as delta-rs takes them)."""
    return {
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        **overrides,
    }


class StrictMotoS3(MotoS3):
    """A moto server that checks credentials (none exist, so every key is refused: 403)."""

    def start(self, timeout_s: float = 60.0) -> StrictMotoS3:
        """Start the service (no bucket: nothing could create one)."""
        self.process = subprocess.Popen(
            [self.binary, "-H", self.host, "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        msg = f"moto_server did not answer on {self.endpoint} within {timeout_s}s"
        raise RuntimeError(msg)
