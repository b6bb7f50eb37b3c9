"""Keep-masks: a data file with removed rows read beside a byte per row that says which rows stay.

Both table formats remove rows without rewriting their file (Delta's deletion vectors,
Iceberg's position deletes). Anti-joining every row's (file, position) with the removed
ones costs a hash join over the table; a file with removed rows read alone, ``POSITIONAL
JOIN``ed with its mask, costs a second column scanned in step with it (2M rows, 59k removed:
10 ms against 50 ms, bench/RESULTS.md). The rest of the table's files are read as they are.

Invariant: a ``whole`` mask has exactly one entry per row of its file (its length read from the
file's own footer), so the join never pads either side and ``= 1`` keeps exactly the live rows.
Filters a query puts on the view stay above the ``POSITIONAL JOIN`` (DuckDB does not push them
below it), so they never shift rows against the mask.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb
import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

from warehouse_loader.sql_text import quote

#: Up to this many files with removed rows are read beside their keep-masks; more are anti-joined
#: (one query plan whatever the number of files, instead of one scan per file).
POSITIONAL_FILES = 32
#: The column of a file's keep-mask, read beside the file.
KEEP_COLUMN = "__hw_keep"


class KeepMask(NamedTuple):
    """A file's keep-mask and the positions it removes.

    ``whole``: one ``uint8`` per row of the file (1: the row stays), read from the file's own
    row count. Otherwise a boolean per row (True: the row stays) up to the last removed row, as
    delta-rs gives it: a row past its end stays.
    """

    keep: pa.Array
    removed: np.ndarray
    whole: bool = False


def whole_mask(removed: np.ndarray, rows: int) -> KeepMask | None:
    """The ``whole`` mask of a file of ``rows`` rows less ``removed`` (any order, repeats allowed).

    None when a position is past the file's end: the removals do not describe this file, and
    the caller reads it another way. A byte per row: DuckDB filters bytes without NULLs 3 ms
    faster than bits on 2M rows.
    """
    positions = removed.astype(np.int64, copy=False)
    if len(positions) and (int(positions.max()) >= rows or int(positions.min()) < 0):
        return None
    if len(positions) > 1 and not (positions[1:] > positions[:-1]).all():
        positions = np.unique(positions)
    keep = np.ones(rows, dtype=np.uint8)
    keep[positions] = 0
    return KeepMask(pa.array(keep), positions, whole=True)


def masked_rows(con: duckdb.DuckDBPyConnection, keep_name: str, source: str, mask: KeepMask) -> str:
    """The query of the rows of ``source`` (one file's scan, in file order) that ``mask`` keeps.

    Registers the mask on ``con`` as ``keep_name``; ``source`` is a ``FROM`` item (a table
    function call or a parenthesized query) over exactly one file.
    """
    con.register(keep_name, pa.table({KEEP_COLUMN: mask.keep}))
    # A mask of the file's length has no NULL past its end to keep: 3 ms less on 2M rows.
    stays = f"k.{KEEP_COLUMN} = 1" if mask.whole else f"k.{KEEP_COLUMN} IS NOT false"
    return f"SELECT t.* FROM {source} t POSITIONAL JOIN {quote(keep_name)} k WHERE {stays}"
