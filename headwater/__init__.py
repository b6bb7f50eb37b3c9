"""Headwater: change-data-capture from PostgreSQL into a unified log, feeds and a warehouse."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("headwater")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
