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

from typing import Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from derived_feeds import event_schema as cols
from log.envelope import Op

#: Ops of row changes (a truncate stays one row of its own: it has no key).
CHANGE_OPS: Final = (Op.CREATE.value, Op.UPDATE.value, Op.READ.value, Op.DELETE.value, Op.TRUNCATE.value)


def latest_per_key(table: pa.Table) -> pa.Table:
    """Per ``(topic, key)`` the latest change by ``(__hw_seq, partition, offset)``, with the key's first op.

    Rows without a key stay one row each (their first op is their op); messages and
    tombstones (ops other than row changes) are left out. A null ``__hw_seq`` sorts
    before every sequence, as in Spark's ordering of the same struct.
    """
    changes = table.filter(pc.fill_null(pc.is_in(table.column(cols.OP), pa.array(CHANGE_OPS)), False))
    has_key = changes.column(cols.KEY).is_valid()
    keyless = changes.filter(pc.invert(has_key))
    keyed = changes.filter(has_key)
    order = pc.sort_indices(
        keyed,
        sort_keys=[
            (cols.TOPIC, "ascending", "at_start"),
            (cols.KEY, "ascending", "at_start"),
            (cols.SEQ, "ascending", "at_start"),
            (cols.PARTITION, "ascending", "at_start"),
            (cols.OFFSET, "ascending", "at_start"),
        ],
    )
    ordered = keyed.take(order)
    rows = ordered.num_rows
    if rows:
        keys = ordered.column(cols.KEY).combine_chunks()
        topics = ordered.column(cols.TOPIC).combine_chunks()
        # new_group[i]: row i starts a (topic, key) group.
        same = pc.and_(
            pc.equal(keys.slice(1), keys.slice(0, rows - 1)), pc.equal(topics.slice(1), topics.slice(0, rows - 1))
        )
        new_group = np.concatenate([[True], ~same.to_numpy(zero_copy_only=False)])
        firsts = np.flatnonzero(new_group)
        lasts = np.concatenate([firsts[1:] - 1, [rows - 1]])
        latest = ordered.take(pa.array(lasts))
        first_ops = ordered.column(cols.OP).take(pa.array(firsts))
    else:
        latest, first_ops = ordered, pa.array([], pa.string())
    latest = latest.append_column(cols.FIRST_OP, first_ops)
    keyless = keyless.append_column(cols.FIRST_OP, keyless.column(cols.OP))
    return pa.concat_tables([latest, keyless])
