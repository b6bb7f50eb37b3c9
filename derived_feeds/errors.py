"""Errors of derived feeds: configuration found wrong at start, expectations that stop a feed, versions."""

from __future__ import annotations

from core.config import loaded_config_name
from core.errors import HeadwaterError, PermanentError


class DerivedFeedsError(HeadwaterError):
    """Base class of derived-feed errors."""


class FeedConfigError(DerivedFeedsError, PermanentError):
    """A feed's spec cannot run (unknown feed, column, expectation or argument); found before any batch."""

    def __init__(self, feed: str, field: str, message: str) -> None:
        super().__init__(f"{loaded_config_name()}: feeds.{feed}.{field}: {message}")
        self.feed = feed
        self.field = field


class FeedExpectationError(DerivedFeedsError, PermanentError):
    """An expectation with ``action: fail`` failed: the feed stops before writing the batch."""

    def __init__(self, feed: str, expectation: str, column: str | None, sample: str, failed: int) -> None:
        on = f" on column {column!r}" if column else ""
        super().__init__(
            f"feed {feed}: expectation {expectation}{on} failed for {failed} row(s), e.g. value {sample}; "
            "nothing of this micro-batch was written: fix the data or set the expectation's action to warn or drop"
        )
        self.feed = feed
        self.expectation = expectation
        self.column = column
        self.sample = sample


class FeedVersionError(DerivedFeedsError, PermanentError):
    """A version pointer or reprocess request that cannot be honoured."""


class FeedKeyError(DerivedFeedsError, PermanentError):
    """Two rows of a feed's SQL have the same key: the feed stops before writing the micro-batch."""

    def __init__(self, feed: str, key: str, rows: int) -> None:
        super().__init__(
            f"feed {feed}: {rows} rows of its SQL have the key {key}; nothing of this micro-batch was written: "
            f"make feeds.{feed}.key columns that identify one row (e.g. add the lookup's key), or aggregate"
        )
        self.feed = feed
        self.key = key
