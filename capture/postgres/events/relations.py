"""The relations of one replication stream: each table's shape, topic and key, and its schema records.

A Relation message (or the catalog, for snapshots) gives a table's columns; :class:`Relations`
caches what building its events needs (:class:`TableShape`) and returns a schema record for
``_headwater.schemas`` whenever the shape a reader sees changes (columns kept, their types,
the key). The key rule is :meth:`Relations.key_positions`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import orjson

from capture.column_policy import ColumnPolicy, ColumnRules, ColumnShape
from capture.errors import ConfiguredKeyError, KeyColumnExcludedError
from capture.postgres.catalog_state import CatalogTable
from capture.postgres.decoding.pgoutput_messages import Relation, ReplicaIdentity
from capture.postgres.events.rows import RowConverter, TextRowDecoder
from capture.postgres.events.schema_transitions import REWRITTEN, SchemaChange, schema_change
from capture.quarantine import error_headers, quarantine_value, raw_values
from capture.records import OutRecord, SchemaRecord, dumps_kept
from capture.tuples import UNCHANGED_TOAST, TupleData
from core.source_config import ColumnsConfig, column_table
from log.envelope import Op
from log.row_types import LogicalKind, LogicalType, connect_schema
from log.sequence import Sequence as Seq
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

logger = logging.getLogger(__name__)


#: A table's catalog state now, by relation oid (None: the table is gone).
CatalogLookup: TypeAlias = Callable[[int], CatalogTable | None]


@dataclass(frozen=True, slots=True)
class Reread:
    """A table whose rows must be read again after a schema change (:mod:`capture.postgres.events.schema_transitions`).

    ``version`` is the schema version that asked for it; ``has_primary_key`` whether an
    incremental snapshot can read it in key order; ``partitions_dropped`` whether rows left it
    without a change in the stream (a partition detached or dropped).
    """

    topic: str
    schema: str
    name: str
    version: int
    reason: str
    has_primary_key: bool
    partitions_dropped: bool = False
    oid: int | None = None

    @property
    def qualified(self) -> str:
        """``schema.table`` (raw names, for messages)."""
        return f"{self.schema}.{self.name}"


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
        catalog: CatalogLookup | None = None,
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
        self._catalog = catalog
        #: The latest schema record of each topic, and every column name its versions had.
        self._latest: dict[str, Mapping[str, Any]] = {}
        self._names_seen: dict[str, set[str]] = {}
        #: A table keeps its topic when it is renamed: topics by relation oid.
        self._topic_by_oid: dict[int, str] = {}
        #: Tables to read again after schema changes, taken by the stream (:meth:`take_rereads`).
        self._rereads: list[Reread] = []
        #: Topics whose table the stream truncated since their latest schema record.
        self._truncated: set[str] = set()
        #: Topics the stream truncated since the last :meth:`take_truncations`, in order.
        self._truncations: list[str] = []
        self._relation_counts: dict[int, int] = {}

    def known_schema(self, topic: str, value: Mapping[str, Any], *, names_seen: Collection[str] = ()) -> None:
        """Seed the last published schema of ``topic`` (read back from ``_headwater.schemas``).

        ``names_seen``: the column names of the topic's earlier versions.
        """
        self._schemas_seen[topic] = _schema_fingerprint(value)
        self._schema_versions[topic] = int(value["version"])
        self._latest[topic] = value
        self._names_seen[topic] = {*names_seen, *(str(c["name"]) for c in value.get("columns", ()))}
        oid = value.get("relation_oid")
        if oid is not None:
            self._topic_by_oid[int(oid)] = topic

    def truncated(self, topic: str) -> None:
        """The stream carries a TRUNCATE of ``topic``'s table: its new storage asks for no re-read.

        A TRUNCATE gives the table new storage, which alone would read as a rewrite; the stream says
        every row is gone, and rows after it arrive as changes. A re-read queued for the storage
        alone (pgoutput sends the Relation before the TRUNCATE) is dropped; any other reason stays.
        """
        self._truncated.add(topic)
        self._truncations.append(topic)
        self._rereads = [r for r in self._rereads if not (r.topic == topic and r.reason == REWRITTEN)]

    def take_rereads(self) -> list[Reread]:
        """The re-reads schema changes asked for since the last call."""
        taken, self._rereads = self._rereads, []
        return taken

    def take_truncations(self) -> list[str]:
        """The topics the stream truncated since the last call.

        A re-read for new storage alone that was taken before (already queued for reading) is
        moot too: :meth:`capture.postgres.streaming.schema_watch.SchemaWatch.follow` drops it.
        """
        taken, self._truncations = self._truncations, []
        return taken

    def latest_schema(self, topic: str) -> Mapping[str, Any] | None:
        """The latest schema record of ``topic`` known here (None: none yet)."""
        return self._latest.get(topic)

    def topic_for(self, oid: int, namespace: str, name: str) -> str:
        """The topic of a table: the one it had when first recorded (a renamed table keeps it)."""
        return self._topic_by_oid.get(oid) or table_topic(self._source, namespace, name)

    def relation_count(self, oid: int) -> int:
        """How many Relations of table ``oid`` this stream has cached (a schema check compares it later)."""
        return self._relation_counts.get(oid, 0)

    def differs(self, table: CatalogTable) -> bool:
        """True when ``table``'s catalog state is not the one its topic's latest schema record describes."""
        relation = table.relation()
        topic = self.topic_for(relation.oid, relation.namespace, relation.name)
        if topic not in self._schemas_seen:
            return True
        body, _ = self._body(topic, relation, table)
        return self._schemas_seen[topic] != _schema_fingerprint(body)

    def relation(
        self, relation: Relation, *, at: Seq | None = None, table: CatalogTable | None = None
    ) -> SchemaRecord | None:
        """Cache a Relation; return a schema record when the table's shape (or storage) changed.

        ``at``: where the new shape starts in the source's order (the position the next change
        of the table will take; None on snapshot paths, where it is not known). ``table``: its
        catalog state (read now when not given). A change that leaves existing rows with values
        the stream never carried queues a :class:`Reread`.
        """
        topic = self.topic_for(relation.oid, relation.namespace, relation.name)
        names = [column.name for column in relation.columns]
        self._relation_counts[relation.oid] = self._relation_counts.get(relation.oid, 0) + 1
        if table is None and self._catalog is not None:
            table = self._catalog(relation.oid)
        version = self._schema_versions.get(topic, 0)
        body, change = self._body(topic, relation, table)
        rules = policy_rules(self._policy, relation)
        keep = rules.keep
        key_positions = [names.index(name) for name in body["key"]]
        fingerprint = _schema_fingerprint(body)
        changed = self._schemas_seen.get(topic) != fingerprint
        previous = self._latest.get(topic)
        record: dict[str, Any] | None = None
        if changed:
            version += 1
            self._schema_versions[topic] = version
            self._schemas_seen[topic] = fingerprint
            record = {**body, "version": version}
            if previous is not None:
                reason = change.reread
                keyless = not (table is not None and table.primary_key)
                if reason == REWRITTEN and (topic in self._truncated or keyless):
                    # The truncate the stream carried is the change (see truncated). A table without a
                    # primary key cannot be re-read, and the catalog is read now, after the stream's
                    # position: new storage seen at a Relation may come from a TRUNCATE further on in
                    # the stream. Same columns and types: VACUUM FULL, CLUSTER and TRUNCATE change no
                    # value; only ALTER ... TYPE <same type> USING would, hence the warning.
                    if topic not in self._truncated:
                        logger.warning(
                            "source %s: table %s.%s has new storage with the same columns (VACUUM FULL, "
                            "CLUSTER or TRUNCATE); after an ALTER COLUMN ... TYPE <same type> USING on it, run "
                            "'headwater source resync %s' (it has no primary key to read its rows again by)",
                            self._source,
                            relation.namespace,
                            relation.name,
                            self._source,
                        )
                    reason = None
                    change = SchemaChange(
                        change.attnums, change.renamed, None, change.partitions_dropped, change.storage
                    )
                if at is None and change.renamed:
                    # Not placed in the stream, so not claimed as a rename (_change_block): the new
                    # name's values come from reading the rows again.
                    new, old = next(iter(change.renamed.items()))
                    renamed = f"column {old!r} was renamed to {new!r} while capture was not streaming the table"
                    reason = renamed if reason is None else f"{reason}; {renamed}"
                    change = SchemaChange(change.attnums, {}, reason, change.partitions_dropped, change.storage)
                record["change"] = _change_block(change, at, previous, body)
                if reason is not None:
                    has_key = bool(table is not None and table.primary_key)
                    self._rereads.append(
                        Reread(
                            topic,
                            relation.namespace,
                            relation.name,
                            version,
                            reason,
                            has_key,
                            change.partitions_dropped,
                            relation.oid,
                        )
                    )
            self._latest[topic] = record
            self._truncated.discard(topic)
            self._names_seen.setdefault(topic, set()).update(names)
            if table is not None:
                self._topic_by_oid[relation.oid] = topic
        key_names = list(body["key"])
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
        if record is None:
            return None
        return SchemaRecord(topic, orjson.dumps(record))

    def _body(self, topic: str, relation: Relation, table: CatalogTable | None) -> tuple[dict[str, Any], SchemaChange]:
        """The schema record of ``relation`` without its version, and how it changes the topic's latest."""
        qualified = f"{relation.namespace}.{relation.name}"
        names = [column.name for column in relation.columns]
        rules = policy_rules(self._policy, relation)
        keep = rules.keep
        key_positions, key_source = self.key_positions(relation, keep)
        rules.check_masked_key(self._source, qualified, names, key_positions)
        change = schema_change(self._latest.get(topic), table, relation, names_seen=self._names_seen.get(topic, ()))
        decode = self._decoder_for(relation)
        converter = decode.converter if isinstance(decode, TextRowDecoder) else None
        columns = [
            _schema_column(relation, i, i in key_positions, rules, converter, attnums=change.attnums) for i in keep
        ]
        body: dict[str, Any] = {
            "topic": topic,
            "schema": relation.namespace,
            "table": relation.name,
            "replica_identity": relation.replica_identity.value,
            "key": [names[i] for i in key_positions],
            "key_source": key_source,
            "columns": columns,
        }
        if table is not None:
            body["relation_oid"] = relation.oid
            # A version whose storage the catalog cannot vouch for keeps the previous one (schema_transitions).
            body["storage"] = table.storage if change.storage is None else change.storage
        return body, change

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

    def topic_of(self, relation_oid: int) -> str:
        """The topic of a cached relation."""
        return self.tables[relation_oid].topic


#: The type oid a masked column is recorded with (``text``): its values are strings.
MASKED_TYPE_OID: Final = 25
_VARCHAR, _BPCHAR = 1043, 1042


def column_shapes(relation: Relation) -> list[ColumnShape]:
    """The relation's columns as column policies see them (a char(n)/varchar(n) column's length is n)."""
    return [
        ColumnShape(c.name, c.atttypmod - 4 if c.type_oid in (_VARCHAR, _BPCHAR) and c.atttypmod > 4 else 0)
        for c in relation.columns
    ]


def policy_rules(policy: ColumnPolicy, relation: Relation) -> ColumnRules:
    """``policy``'s rules of the columns of ``relation``."""
    return policy.rules(f"{relation.namespace}.{relation.name}", column_shapes(relation))


def _schema_column(
    relation: Relation,
    position: int,
    key: bool,
    rules: ColumnRules,
    converter: RowConverter | None,
    *,
    attnums: Mapping[str, int],
) -> dict[str, Any]:
    """A column of a schema record (:mod:`log.table_schemas`): a masked one is text (its values are masked strings).

    The logical type and native name come from the converter (a decoder that is not the type
    map's records only the oid, which readers type as they always have).
    """
    column = relation.columns[position]
    mask = rules.masks.get(position)
    out: dict[str, Any] = {"name": column.name}
    if converter is not None:
        read = LogicalType(LogicalKind.STRING) if mask is not None else converter.read_types[position]
        out["logical"] = connect_schema(read)
        out["native"] = converter.native_types[position]
    out |= {
        "type_oid": column.type_oid if mask is None else MASKED_TYPE_OID,
        "typmod": column.atttypmod if mask is None else -1,
        # The record key, not pgoutput's replica-identity flag (every column under FULL).
        "key": key,
    }
    if mask is not None:
        out["masked"] = mask.kind
    attnum = attnums.get(column.name)
    if attnum is not None:
        out["attnum"] = attnum
    return out


def _change_block(
    change: SchemaChange, at: Seq | None, previous: Mapping[str, Any], body: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``change`` of a schema record (:mod:`log.schema_history`): where it starts, renames, re-read."""
    block: dict[str, Any] = {"at": None if at is None else [at.commit_lsn, at.txn_index]}
    kept = {str(c["name"]) for c in body["columns"]}
    renamed = {new: old for new, old in change.renamed.items() if new in kept}
    if renamed:
        block["renamed"] = renamed
    if (previous.get("schema"), previous.get("table")) != (body["schema"], body["table"]):
        block["table_renamed_from"] = f"{previous.get('schema')}.{previous.get('table')}"
    if change.reread is not None:
        block["reread"] = change.reread
    return block


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
    # What a reader sees of the shape; the version and how it came about are not part of it.
    return orjson.dumps({name: part for name, part in value.items() if name not in ("version", "change")})


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
