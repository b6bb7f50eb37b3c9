"""The relations of one replication stream: each table's shape, topic and key, and its schema records.

A Relation message (or the catalog, for snapshots) gives a table's columns; :class:`Relations`
caches what building its events needs (:class:`TableShape`) and returns a schema record for
``_headwater.schemas`` whenever the shape a reader sees changes (columns kept, their types,
the key). The key rule is :meth:`Relations.key_positions`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import orjson

from capture.column_policy import MASKED_TYPE_OID, ColumnPolicy, ColumnRules
from capture.errors import ColumnSettingError, ConfiguredKeyError, KeyColumnExcludedError
from capture.pgoutput_messages import UNCHANGED_TOAST, Relation, ReplicaIdentity, TupleData
from capture.quarantine import error_headers, quarantine_value, raw_values
from capture.records import OutRecord, SchemaRecord, dumps_kept
from capture.rows import TextRowDecoder
from core.source_config import ColumnsConfig, column_table
from log.envelope import Op
from log.topics import quarantine_topic, table_topic

if TYPE_CHECKING:
    from native._speedups import RowEncoder

#: Decodes one tuple (text-format values) into a JSON row image: every column, in column
#: order; columns whose TOASTed value was not sent hold :data:`UNCHANGED_TOAST`.
RowDecoder: TypeAlias = Callable[[TupleData], dict[str, Any]]
#: Makes the decoder for a relation (built once per Relation message).
RowDecoderFactory: TypeAlias = Callable[[Relation], RowDecoder]
#: The primary-key column names of a relation from the catalog (None: no primary key).
PrimaryKeyLookup: TypeAlias = Callable[[Relation], tuple[str, ...] | None]


@dataclass
class TableShape:
    """A cached relation: its topic, kept columns, key, decoder and the JSON pieces of its events."""

    relation: Relation
    topic: str
    names: list[str]
    keep_names: list[str] | None  # None: every column is kept (no exclusions)
    key_names: list[str]
    single_key_prefix: bytes | None  # b'{"id":' when the key is one column
    decode: RowDecoder
    # The extension's encoder of the same conversion (None: Python only). It answers rows
    # without unchanged TOAST that convert cleanly; every other row takes the Python path.
    encoder: RowEncoder | None
    rules: ColumnRules  # the columns kept and masked (never a left-out value anywhere)
    version: int
    name_json: bytes  # JSON pieces of the source block that never change for the table
    schema_json: bytes
    table_json: bytes

    def image(self, row: TupleData) -> dict[str, Any]:
        """The row image of a tuple, restricted to the kept columns."""
        values = self.decode(row)
        keep = self.keep_names
        return values if keep is None else {name: values[name] for name in keep}

    def key(self, image: Mapping[str, Any] | None) -> bytes | None:
        """The record key of a row image (None: a keyless table, or no image)."""
        if image is None or not self.key_names:
            return None
        prefix = self.single_key_prefix
        if prefix is not None:
            return b"%b%b}" % (prefix, orjson.dumps(image[self.key_names[0]]))
        return dumps_kept({name: image[name] for name in self.key_names})

    def quarantine_record(
        self,
        op: Op,
        source: Mapping[str, object],
        *,
        before: TupleData | None,
        after: TupleData | None,
        exc: Exception,
    ) -> OutRecord:
        """The ``<topic>.quarantine`` record of a change that could not become an event.

        It keeps the raw values of the captured columns (masked ones masked): a column left
        out is not in it, so a quarantined row leaks nothing the events would not show.
        """
        error = f"{self.topic}: {exc}"
        raw_after = raw_values(self.rules, self.names, after)
        raw_before = raw_values(self.rules, self.names, before)
        image = raw_after if raw_after is not None else raw_before
        key = None
        if image is not None and self.key_names and all(name in image for name in self.key_names):
            key = orjson.dumps({name: image[name] for name in self.key_names})
        value = quarantine_value(op=op.value, source=source, before=raw_before, after=raw_after, error=error)
        commit, index = int(str(source["commit_lsn"])), int(str(source["txn_index"]))
        return OutRecord(quarantine_topic(self.topic), key, value, commit, index, error_headers(error))


class Relations:
    """The table shapes of one replication stream, by relation oid, and their schema versions."""

    def __init__(
        self,
        source: str,
        decoder_for: RowDecoderFactory,
        *,
        excluded_columns: Sequence[str] = (),
        columns: ColumnsConfig | None = None,
        primary_key: PrimaryKeyLookup | None = None,
        configured_keys: Mapping[str, Sequence[str]] | None = None,
        schema_versions: Mapping[str, int] | None = None,
        use_native: bool = True,
    ) -> None:
        self._source = source
        self._decoder_for = decoder_for
        self._policy = ColumnPolicy(columns, excluded=excluded_columns)
        self._columns = columns or ColumnsConfig()
        self._primary_key = primary_key
        self._configured_keys = dict(configured_keys or {})
        self._use_native = use_native
        #: The cached shapes by relation oid.
        self.tables: dict[int, TableShape] = {}
        self._schema_versions = dict(schema_versions or {})
        self._schemas_seen: dict[str, bytes] = {}

    def known_schema(self, topic: str, value: Mapping[str, Any]) -> None:
        """Seed the last published schema of ``topic`` (read back from ``_headwater.schemas``)."""
        self._schemas_seen[topic] = _schema_fingerprint(value)
        self._schema_versions[topic] = int(value["version"])

    def relation(self, relation: Relation) -> SchemaRecord | None:
        """Cache a Relation; return a schema record when the table's shape changed."""
        topic = table_topic(self._source, relation.namespace, relation.name)
        qualified = f"{relation.namespace}.{relation.name}"
        names = [column.name for column in relation.columns]
        rules = self._policy.rules(relation)
        keep = rules.keep
        key_positions, key_source = self.key_positions(relation, keep)
        self._check_masked_key(qualified, names, key_positions, rules)
        version = self._schema_versions.get(topic, 0)
        columns = [_schema_column(relation, i, i in key_positions, rules) for i in keep]
        body = {
            "topic": topic,
            "schema": relation.namespace,
            "table": relation.name,
            "replica_identity": relation.replica_identity.value,
            "key": [names[i] for i in key_positions],
            "key_source": key_source,
            "columns": columns,
        }
        fingerprint = orjson.dumps(body)
        changed = self._schemas_seen.get(topic) != fingerprint
        if changed:
            version += 1
            self._schema_versions[topic] = version
            self._schemas_seen[topic] = fingerprint
        key_names = [names[i] for i in key_positions]
        decode = self._decoder_for(relation)
        if isinstance(decode, TextRowDecoder):
            decode = TextRowDecoder(decode.converter.restricted(rules))
        elif len(keep) != len(names) or rules.masks:
            decode = _RestrictedDecoder(decode, names, rules)
        encoder = None
        if self._use_native and isinstance(decode, TextRowDecoder):
            encoder = decode.converter.native_encoder(keep, key_positions)
        self.tables[relation.oid] = TableShape(
            relation=relation,
            topic=topic,
            names=names,
            keep_names=None if len(keep) == len(names) else [names[i] for i in keep],
            key_names=key_names,
            single_key_prefix=b"{%b:" % orjson.dumps(key_names[0]) if len(key_names) == 1 else None,
            decode=decode,
            encoder=encoder,
            rules=rules,
            version=version,
            name_json=orjson.dumps(self._source),
            schema_json=orjson.dumps(relation.namespace),
            table_json=orjson.dumps(relation.name),
        )
        if not changed:
            return None
        return SchemaRecord(topic, orjson.dumps({**body, "version": version}))

    def key_positions(self, relation: Relation, keep: list[int]) -> tuple[list[int], str]:
        """The record key's column positions (in column order) and where the key comes from.

        The one rule for a table's key: the configured key (``sources.<name>.keys``), else the
        primary key, else (REPLICA IDENTITY USING INDEX) the identity index. pgoutput flags the
        replica-identity columns, which under FULL is every column: never the key by itself.
        A key must be carried by every change: under DEFAULT and USING INDEX an update sends
        the old key and a delete sends only the identity columns, so a configured key must be
        among them (FULL sends whole rows). The primary key is not used under USING INDEX when
        the index does not cover it: an update that changes only the primary key sends no old
        key there, so keying by it would leave the old row behind.
        """
        qualified = f"{relation.namespace}.{relation.name}"
        names = [column.name for column in relation.columns]
        identity = [i for i, column in enumerate(relation.columns) if column.key]
        configured = self._configured_keys.get(qualified)
        if configured is not None:
            positions = _configured_positions(self._source, qualified, relation, configured, identity)
            source = "configured"
        elif relation.replica_identity == ReplicaIdentity.FULL:
            primary = self._primary_key(relation) if self._primary_key else None
            positions = [i for i, name in enumerate(names) if primary and name in primary]
            source = "primary_key" if positions else "none"
        elif relation.replica_identity in (ReplicaIdentity.DEFAULT, ReplicaIdentity.INDEX):
            positions = identity
            default = relation.replica_identity == ReplicaIdentity.DEFAULT
            source = ("primary_key" if default else "replica_identity_index") if positions else "none"
        else:
            positions, source = [], "none"
        dropped = [names[i] for i in positions if i not in keep]
        if dropped:
            listed = any(column_table(name) == qualified for name in self._columns.include)
            raise KeyColumnExcludedError(self._source, qualified, dropped, setting="include" if listed else "exclude")
        return positions, source

    def _check_masked_key(self, qualified: str, names: list[str], key: list[int], rules: ColumnRules) -> None:
        # A hash keeps distinct keys distinct; a truncated or replaced key would merge rows.
        merged = [names[i] for i in key if i in rules.masks and rules.masks[i].kind != "hash"]
        if merged:
            mask = rules.masks[names.index(merged[0])].kind
            raise ColumnSettingError(
                self._source,
                "columns.mask",
                f"{qualified}.{merged[0]} is part of the key of {qualified} and a {mask} mask would merge "
                f"distinct keys; mask it with a hash, or give the table another key in sources.{self._source}.keys",
                table=qualified,
            )

    def topic_of(self, relation_oid: int) -> str:
        """The topic of a cached relation."""
        return self.tables[relation_oid].topic


def _schema_column(relation: Relation, position: int, key: bool, rules: ColumnRules) -> dict[str, Any]:
    """A column of a schema record: a masked one is text (its values are masked strings)."""
    column = relation.columns[position]
    mask = rules.masks.get(position)
    out: dict[str, Any] = {
        "name": column.name,
        "type_oid": column.type_oid if mask is None else MASKED_TYPE_OID,
        "typmod": column.atttypmod if mask is None else -1,
        # The record key, not pgoutput's replica-identity flag (every column under FULL).
        "key": key,
    }
    if mask is not None:
        out["masked"] = mask.kind
    return out


class _RestrictedDecoder:
    """A decoder that is not a :class:`TextRowDecoder`, kept from left-out and masked values.

    The inner decoder gets NULL in their place (so it never converts, or quotes, them), and a
    masked column's value is its masked text.
    """

    __slots__ = ("_decode", "_masks", "_names", "_skip")

    def __init__(self, decode: RowDecoder, names: list[str], rules: ColumnRules) -> None:
        self._decode = decode
        self._names = names
        self._masks = rules.masks
        kept = set(rules.keep)
        self._skip = frozenset(i for i in range(len(names)) if i not in kept or i in rules.masks)

    def __call__(self, row: TupleData) -> dict[str, Any]:
        skip = self._skip
        image = self._decode(tuple(None if i in skip else value for i, value in enumerate(row)))
        for i, mask in self._masks.items():
            if i < len(row):
                image[self._names[i]] = row[i] if row[i] is UNCHANGED_TOAST else mask.raw(row[i])
        return image


def _schema_fingerprint(value: Mapping[str, Any]) -> bytes:
    return orjson.dumps({name: part for name, part in value.items() if name != "version"})


def _configured_positions(
    source: str, qualified: str, relation: Relation, configured: Sequence[str], identity: list[int]
) -> list[int]:
    names = [column.name for column in relation.columns]
    unknown = [name for name in configured if name not in names]
    if unknown:
        raise ConfiguredKeyError(source, qualified, f"has no column {unknown[0]!r}")
    positions = sorted(names.index(name) for name in configured)
    if relation.replica_identity != ReplicaIdentity.FULL and not set(positions) <= set(identity):
        missing = next(names[i] for i in positions if i not in identity)
        kind = "DEFAULT" if relation.replica_identity == ReplicaIdentity.DEFAULT else "USING INDEX"
        raise ConfiguredKeyError(
            source,
            qualified,
            f"column {missing!r} is not sent with deletes under REPLICA IDENTITY {kind}; "
            f"run 'ALTER TABLE {qualified} REPLICA IDENTITY FULL' or key the table by its replica identity",
        )
    return positions
