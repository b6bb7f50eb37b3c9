"""The latest row change per key of one log partition's records, in Arrow (the feed's first step, without a shuffle).

A feed keeps, per micro-batch, each source key's latest change and remembers the key's
first op in the batch (``transform.latest_changes`` states the rule). Every record of a
key lives in one log partition (the log partitions by Kafka's murmur2 of the key, on
both backends), so the rule applied to each partition's share of the micro-batch
separately gives exactly the rows the rule gives over the whole batch: the
``headwater_log`` source applies it in the reader (option ``latestPerKey``) and Spark
needs no aggregation, hence no shuffle.

Pure: one Arrow table of the source's rows in, one out (same columns plus ``__hw_first_op``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from spark_log import source_schema as cols


def latest_per_key(table: pa.Table) -> pa.Table:
    """Per ``(topic, key)`` the latest change by ``(__hw_seq, partition, offset)``, with the key's first op.

    Rows without a key (truncates, keyless tables) stay one row each (their first op is
    their op); messages and tombstones (ops other than changes) are left out. A null ``__hw_seq`` sorts
    before every sequence, as in Spark's ordering of the same struct.
    """
    ops = table.column(cols.OP)
    is_change = pc.fill_null(pc.is_in(ops, pa.array(cols.CHANGE_OPS)), False)
    changes = table if pc.all(is_change).as_py() else table.filter(is_change)
    has_key = changes.column(cols.KEY).is_valid()
    if pc.all(has_key).as_py():
        keyless, keyed = changes.slice(0, 0), changes
    else:
        keyless, keyed = changes.filter(pc.invert(has_key)), changes.filter(has_key)
    # A column with one value orders nothing (a reader's table is one topic's partition): left out, same order.
    sort_keys = [
        (name, "ascending", "at_start")
        for name in (cols.TOPIC, cols.KEY, cols.SEQ, cols.PARTITION, cols.OFFSET)
        if name not in (cols.TOPIC, cols.PARTITION) or pc.count_distinct(keyed.column(name), mode="all").as_py() > 1
    ]
    order = pc.sort_indices(keyed, sort_keys=sort_keys).to_numpy()
    rows = len(order)
    if rows:
        # new_group[i]: the i-th row in order starts a (topic, key) group.
        new_group = np.zeros(rows, np.bool_)
        new_group[0] = True
        for name in (cols.KEY, cols.TOPIC):
            column = keyed.column(name).take(order).combine_chunks()
            same = pc.equal(column.slice(1), column.slice(0, rows - 1)).to_numpy(zero_copy_only=False)
            new_group[1:] |= ~same
        firsts = np.flatnonzero(new_group)
        lasts = np.concatenate([firsts[1:] - 1, [rows - 1]])
        latest = keyed.take(pa.array(order[lasts]))
        first_ops = keyed.column(cols.OP).take(pa.array(order[firsts]))
    else:
        latest, first_ops = keyed, pa.array([], pa.string())
    latest = latest.append_column(cols.FIRST_OP, first_ops)
    keyless = keyless.append_column(cols.FIRST_OP, keyless.column(cols.OP))
    return pa.concat_tables([latest, keyless])
