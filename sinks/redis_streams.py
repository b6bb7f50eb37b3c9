"""The Redis Streams kind: ``XADD`` per event, an optional key-value mirror, checkpoints in Redis itself.

Each event is an entry of the stream its topic names (``stream`` template, default the topic)
with fields ``id`` (the idempotency key ``<topic>/<partition>/<offset>``), ``key`` (the record
key's JSON, empty for none) and ``value`` (the event or its transform). With
``mirror_prefix`` each key's latest row is also kept at ``<prefix><topic>:<key JSON>``
(``SET`` its row image as JSON, ``DEL`` on delete; a truncate deletes the topic's keys written
before it by the source's order: it sits in one partition, the keys in all).

**Exactly once** (while Redis keeps its data): one Lua script per batch (atomic in Redis)
checks that this member still owns every partition (the ownership tokens
:class:`~sinks.base.StoresCheckpoints` claims in the hash ``headwater:owners:<group>``),
writes the entries and the mirror, and stores the next offsets in
``headwater:offsets:<group>``, after checking that Redis still holds the checkpoint this member
last read or wrote. A batch is in Redis with its checkpoint or not at all, so a retry after a
lost connection or a SIGKILL never repeats an entry, and a Redis that lost writes (restarted
empty, or from an older snapshot) makes the member join again and deliver from the checkpoint
Redis holds: nothing it lost stays lost. A stream key holding
another type refuses the batch before anything is written: those records are poison (dead
letter) and the rest is written. Other errors (connection, OOM, loading) are retried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from core.sink_config import RedisOptions, TransformConfig
from log.base import TopicPartition
from log.consumer import Checkpoint
from log.errors import FencedMemberError
from log.topics import sink_group
from sinks.base import Guarantee, Reject
from sinks.errors import TargetUnavailableError
from sinks.records import Rejection, SinkRecord, topic_fields
from sinks.transform import Transform

# KEYS: offsets hash, owners hash, mirror prefix. ARGV: checkpoint count, maxlen ("" for none), the fields per
# record (4 without a mirror, 9 with one), then (field, token, next offset, the offset Redis must hold now, "" for
# none) each checkpoint; then per record (stream, id, key, value) and, with a mirror, (mirror op "set"/"del"/"trunc"/"",
# key JSON, row JSON, source position as sortable text, topic). Without a mirror no record carries unused fields
# (a batch's arguments are what Redis parses and redis-py packs one by one). The mirror keeps each key's position in
# <prefix><topic>:__hw_positions and each topic's last truncate in <prefix>__hw_truncates, so a truncate removes only
# older rows and an older change delivered after it (from another partition) is not applied.
# Returns {"ok"}, {"fenced", field}, {"moved", field} (Redis holds another checkpoint than this member saved:
# restarted from an older snapshot) or {"wrongtype", record index...} (1-based); nothing written but on "ok".
_SCRIPT = """
local n, maxlen, stride = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
for i = 0, n - 1 do
  local field, token, expected = ARGV[4 + i * 4], ARGV[5 + i * 4], ARGV[7 + i * 4]
  if redis.call('HGET', KEYS[2], field) ~= token then return {'fenced', field} end
  if (redis.call('HGET', KEYS[1], field) or '') ~= expected then return {'moved', field} end
end
local base = 4 + n * 4
local count = (#ARGV - base + 1) / stride
local bad = {}
local checked = {}
for r = 0, count - 1 do
  local stream = ARGV[base + r * stride]
  if checked[stream] == nil then
    local t = redis.call('TYPE', stream)['ok']
    checked[stream] = (t == 'stream' or t == 'none')
  end
  if not checked[stream] then bad[#bad + 1] = r + 1 end
end
if #bad > 0 then table.insert(bad, 1, 'wrongtype'); return bad end
for r = 0, count - 1 do
  local at = base + r * stride
  local stream = ARGV[at]
  if maxlen == '' then
    redis.call('XADD', stream, '*', 'id', ARGV[at + 1], 'key', ARGV[at + 2], 'value', ARGV[at + 3])
  else
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
               'id', ARGV[at + 1], 'key', ARGV[at + 2], 'value', ARGV[at + 3])
  end
  local op = stride > 4 and ARGV[at + 4] or ''
  if op ~= '' then
    local key, position, topic = ARGV[at + 5], ARGV[at + 7], ARGV[at + 8]
    local positions = KEYS[3] .. topic .. ':__hw_positions'
    local truncated = redis.call('HGET', KEYS[3] .. '__hw_truncates', topic)
    if op == 'trunc' then
      local held = redis.call('HGETALL', positions)
      for i = 1, #held, 2 do
        if held[i + 1] < position then
          redis.call('DEL', KEYS[3] .. topic .. ':' .. held[i])
          redis.call('HDEL', positions, held[i])
        end
      end
      if not truncated or truncated < position then
        redis.call('HSET', KEYS[3] .. '__hw_truncates', topic, position)
      end
    elseif not truncated or truncated < position then
      if op == 'set' then
        redis.call('SET', KEYS[3] .. topic .. ':' .. key, ARGV[at + 6])
        redis.call('HSET', positions, key, position)
      else
        redis.call('DEL', KEYS[3] .. topic .. ':' .. key)
        redis.call('HDEL', positions, key)
      end
    end
  end
end
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[4 + i * 4], ARGV[6 + i * 4])
end
return {'ok'}
"""


def _field(tp: TopicPartition) -> str:
    return f"{tp.topic}/{tp.partition}"


class RedisStreamSink:
    """Writes batches to Redis with their checkpoints (see the module docstring)."""

    guarantee = Guarantee(
        "exactly once (checkpoints in Redis, written with the entries by one script)",
        'the entry\'s "id" field (<topic>/<partition>/<offset>)',
    )

    def __init__(self, name: str, options: RedisOptions, transform: TransformConfig) -> None:
        self.name = name
        self.options = options
        self._transform = Transform(transform)
        self._client: Any = None
        self._script: Any = None
        self._streams: dict[str, str] = {}
        #: The checkpoint this member last read or wrote per partition: Redis must still hold it.
        self._saved: dict[TopicPartition, int | None] = {}

    def _keys(self, group: str) -> list[str]:
        return [f"headwater:offsets:{group}", f"headwater:owners:{group}"]

    def open(self) -> None:
        """Connect and load the script; :class:`TargetUnavailableError` when Redis does not answer."""
        import redis

        if self._client is None:
            self._client = redis.Redis.from_url(
                self.options.url.get_secret_value(), socket_timeout=30, socket_connect_timeout=5
            )
            self._script = self._client.register_script(_SCRIPT)
        self._call(self._client.ping)

    def _call(self, action: Any, *args: Any, **kwargs: Any) -> Any:
        import redis

        try:
            return action(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
            raise TargetUnavailableError(self.name, f"redis: {exc}") from None
        except redis.ResponseError as exc:  # OOM, MISCONF (cannot persist), READONLY replica: all pass with time
            raise TargetUnavailableError(self.name, f"redis answered: {exc}") from None

    def claim(self, group: str, owners: Mapping[TopicPartition, str]) -> dict[TopicPartition, int]:
        """Record each partition's owner token; return the next offsets Redis holds."""
        offsets, owner_key = self._keys(group)
        ordered = sorted(owners.items())
        pipe = self._client.pipeline(transaction=True)
        if ordered:
            pipe.hset(owner_key, mapping={_field(tp): token for tp, token in ordered})
            pipe.hmget(offsets, [_field(tp) for tp, _ in ordered])
        results = self._call(pipe.execute) if ordered else []
        found = results[-1] if results else []
        stored = {tp: None if value is None else int(value) for (tp, _), value in zip(ordered, found, strict=True)}
        self._saved.update(stored)
        return {tp: offset for tp, offset in stored.items() if offset is not None}

    def stored(self, group: str, partition: TopicPartition) -> int | None:
        """The next offset Redis holds for ``partition``."""
        value = self._call(self._client.hget, self._keys(group)[0], _field(partition))
        return None if value is None else int(value)

    def rewind(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Store ``offsets`` and drop every owner token (a running member is fenced)."""
        offset_key, owner_key = self._keys(group)
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(owner_key)
        if offsets:
            pipe.hset(offset_key, mapping={_field(tp): offset for tp, offset in offsets.items()})
        self._call(pipe.execute)

    def deliver(
        self, records: Sequence[SinkRecord], checkpoints: Mapping[TopicPartition, Checkpoint], reject: Reject
    ) -> None:
        """Write ``records`` and ``checkpoints`` in one script; a stream of the wrong type rejects its records."""
        group = sink_group(self.name)
        pending = list(records)
        while True:
            answer = self._run(pending, checkpoints, group)
            status = answer[0].decode() if isinstance(answer[0], bytes) else str(answer[0])
            if status == "ok":
                self._saved.update({tp: c.offset for tp, c in checkpoints.items()})
                return
            if status in ("fenced", "moved"):
                topic, _, partition = answer[1].decode().rpartition("/")
                reason = (
                    "another member claimed it in Redis"
                    if status == "fenced"
                    else "Redis holds another checkpoint than this member saved (restarted from an older snapshot?)"
                )
                raise FencedMemberError(group, "-", topic, int(partition), reason)
            bad = {int(i) - 1 for i in answer[1:]}
            reject(
                [
                    Rejection(pending[i], f"redis key {self._stream(pending[i].topic)} is not a stream")
                    for i in sorted(bad)
                ]
            )
            pending = [r for i, r in enumerate(pending) if i not in bad]

    def _run(self, records: Sequence[SinkRecord], checkpoints: Mapping[TopicPartition, Checkpoint], group: str) -> Any:
        maxlen = "" if self.options.maxlen is None else self.options.maxlen
        mirror = self.options.mirror_prefix
        args: list[Any] = [len(checkpoints), maxlen, 4 if mirror is None else 9]
        for tp, checkpoint in sorted(checkpoints.items()):
            expected = self._saved.get(tp)
            args += [_field(tp), checkpoint.owner, checkpoint.offset, "" if expected is None else expected]
        stream = self._stream
        if mirror is None:
            for r in records:
                args += (stream(r.topic), r.event_id, r.key or b"", r.payload)
        else:
            for r in records:
                args += (stream(r.topic), r.event_id, r.key or b"", r.payload)
                args += self._mirror(r)
        return self._call(self._script, keys=[*self._keys(group), mirror or ""], args=args)

    def _mirror(self, record: SinkRecord) -> list[Any]:
        event = orjson.loads(record.value)
        op = event.get("op")
        source = event.get("source") or {}
        position = b"%020d%010d" % (int(source.get("commit_lsn", 0)), int(source.get("txn_index", 0)))
        key = record.key or b"null"
        if op == "t":
            return ["trunc", "", "", position, record.topic]
        if op == "d":
            return ["del", key, "", position, record.topic]
        if op in ("c", "u", "r"):
            return ["set", key, orjson.dumps(self._transform.row(event.get("after"))), position, record.topic]
        return ["", "", "", "", ""]

    def _stream(self, topic: str) -> str:
        stream = self._streams.get(topic)
        if stream is None:
            stream = self._streams[topic] = self.options.stream.format(**topic_fields(topic))
        return stream

    def close(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            self._client.close()
            self._client = None
