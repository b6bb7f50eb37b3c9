"""Property test over crash points: what reopening does depends only on where the damage is.

A writer appends ``acknowledged`` batches and closes cleanly (its recovery point is then
their end); a second writer appends more and dies without closing (a forked child, like a
SIGKILL) before its recovery point moves. Then the active segment is cut at a random
byte, or one random byte is flipped. Expected on reopen:

* a cut before the recovery point, or a damaged batch starting before it, or a damaged
  batch followed by a valid one: :class:`CorruptLogError`, and the file is left as it is;
* otherwise a torn tail: exactly the batches wholly before the damage survive, and
  appends continue after them.
"""

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log.base import Record, TopicSpec
from log.errors import CorruptLogError
from log.file.backend import FileLog
from log.file.batch_codec import parse_header
from log.file.recovery_point import load_recovery_point
from log.file.segment import list_segments
from tests.unit.log.file.test_recovery_point import die_after_appending

batches_strategy = st.lists(
    st.lists(st.integers(min_value=0, max_value=1500), min_size=1, max_size=4),  # value sizes of a batch
    min_size=1,
    max_size=8,
)


def make_batch(number, sizes):
    return [Record(b"k%d" % (j % 3), (b"%d:%d:" % (number, j)).ljust(size, b"v")) for j, size in enumerate(sizes)]


def append_and_die(root, batches, first):
    records = [make_batch(number, sizes) for number, sizes in enumerate(batches, start=first)]
    die_after_appending(root, records, interval=1e9, compression="none")  # dies before its point moves


def boundaries(data):
    """``(start, end, first_offset, next_offset)`` of every batch in a segment's bytes."""
    out, pos = [], 0
    while pos < len(data):
        header = parse_header(data, pos)
        out.append((pos, pos + header.length, header.base_offset, header.next_offset))
        pos += header.length
    return out


@settings(
    max_examples=int(os.environ.get("HW_PROP_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    batches=batches_strategy,
    acknowledged_share=st.floats(min_value=0.0, max_value=1.0),
    damage=st.sampled_from(["cut", "flip"]),
    where=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_reopening_after_a_crash_and_damage(batches, acknowledged_share, damage, where):
    root = Path(tempfile.mkdtemp(prefix="hw-rp-prop-")) / "log"
    try:
        acknowledged = round(len(batches) * acknowledged_share)
        with FileLog(root, compression="none") as log:
            log.create_topic(TopicSpec("t", partitions=1))
            for number, sizes in enumerate(batches[:acknowledged]):
                log.append("t", 0, make_batch(number, sizes))
        append_and_die(root, batches[acknowledged:], acknowledged)

        [(_, path)] = list_segments(root / "t" / "0")
        data = path.read_bytes()
        layout = boundaries(data)
        point = load_recovery_point(root / "t" / "0")
        recovery_point = point.end if point is not None else 0
        assert recovery_point == (layout[acknowledged - 1][1] if acknowledged else 0)

        if damage == "cut":
            at = int(len(data) * where)
            os.truncate(path, at)
            whole = [b for b in layout if b[1] <= at]
            corrupt = at < recovery_point
        else:
            at = int(len(data) * where)
            victim = next(n for n, b in enumerate(layout) if b[0] <= at < b[1])
            with open(path, "r+b") as fh:
                fh.seek(at)
                fh.write(bytes([data[at] ^ 0x5A]))
            whole = layout[:victim]
            corrupt = victim < len(layout) - 1 or layout[victim][0] < recovery_point
        left = path.read_bytes()

        with FileLog(root, compression="none") as log:
            if corrupt:
                try:
                    log.read("t", 0, 0, max_records=100_000)
                except CorruptLogError as error:
                    assert error.path == str(path)
                else:
                    raise AssertionError(f"damage at byte {at} ({damage}) before {recovery_point} not reported")
                assert path.read_bytes() == left, "acknowledged bytes were truncated"
                return
            end = whole[-1][3] if whole else 0
            assert [r.offset for r in log.read("t", 0, 0, max_records=100_000)] == list(range(end))
            assert path.stat().st_size == (whole[-1][1] if whole else 0)
            assert log.append("t", 0, make_batch(99, [10])).base_offset == end
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
