"""Schema changes the stream alone cannot carry end exact, through the real CLI (issue 27 regressions).

PostgreSQL writes no row change for a constant default added in place or for a column
rename: before issue 27, ``ADD COLUMN ... DEFAULT 'x'`` left NULL in every warehouse row not
updated since, and ``RENAME COLUMN`` left the new column NULL there, while ``run`` reported
success. Both tables are captured, loaded, changed by DDL, partly updated, and captured and
loaded again; SCD1 must equal the source, SCD2's open versions too, with one version more
per row whose value the default changed and none for the rename (one history under the new
name).
"""

from __future__ import annotations

import json

import yaml
from harness.ddl_matrix import DdlCase, DdlProject

from log.sequence import Lsn, Sequence


def test_added_default_and_renamed_column_end_exact(pg_database, unique_name, tmp_path):
    cases = [
        DdlCase("add_default", {1: "ADD COLUMN tag text DEFAULT 'x'"}, frozenset({1})),
        DdlCase("rename_column", {1: "RENAME COLUMN note TO remark"}),
    ]
    project = DdlProject(pg_database, unique_name("ddr"), tmp_path, cases, rows=200)
    try:
        project.cli("run", "--until-caught-up")
        before = [p for case in cases for p in project.problems(case)]
        assert not before, before
        ddl_from = Lsn.parse(pg_database.execute("SELECT pg_current_wal_lsn()::text")[0][0])
        project.apply(1)
        for case in cases:
            for _ in range(40):
                project.touch(case)
        ddl_to = Lsn.parse(pg_database.execute("SELECT pg_current_wal_lsn()::text")[0][0])
        project.cli("run", "--until-caught-up")
        problems = [p for case in cases for p in project.problems(case)]
        # The versions the default opened start at the DDL's position (the table's first change after
        # it), not where the re-read came (after everything above was written).
        starts = project.warehouse_rows("add_default_scd2", ["id", "tag", "__START_AT"]) or []
        untouched = {k for k, _ in project.ddl_rows["add_default"]} - {k for k, _ in project.touched["add_default"]}
        opened = {key: Sequence.from_sortable(start).commit_lsn for key, tag, start in starts if tag == "x"}
        late = sorted(k for k in untouched if not ddl_from.value <= opened.get(k, 0) <= ddl_to.value)
        if late:
            problems.append(f"{len(late)} of {len(untouched)} versions the default opened do not start at the DDL")
        for table in ("add_default_scd1", "rename_column_scd1"):  # verify compares every current column
            verified = project.cli("verify", table, check=False)
            if verified.returncode != 0:
                problems.append(f"verify {table}: {verified.stdout[-500:]} {verified.stderr[-500:]}")
    finally:
        project.close()
    assert not problems, "\n".join(problems)


def test_a_feed_reading_a_renamed_or_dropped_column_stops_in_one_line(pg_database, unique_name, tmp_path):
    """A maintained view (GROUP BY) over a renamed column, a projection over a dropped one: one line each, in status."""
    cases = [DdlCase("renamed", {1: "RENAME COLUMN note TO remark"}), DdlCase("dropped", {1: "DROP COLUMN name"})]
    project = DdlProject(pg_database, unique_name("ddf"), tmp_path, cases, rows=20)
    feeds = {
        "by_note": {
            "from": project.topic(cases[0]),
            "sql": "SELECT note, count(*) AS n FROM source GROUP BY note",
            "key": ["note"],
        },
        "names": {"from": project.topic(cases[1]), "sql": "SELECT id, name FROM source", "key": ["id"]},
    }
    try:
        document = yaml.safe_load(project.config_path.read_text())
        document["feeds"] = feeds
        document["warehouse"] = {"tables": {}}
        project.config_path.write_text(yaml.safe_dump(document))
        project.cli("capture", "--until-caught-up")
        project.cli("feeds", "run", "--available-now")
        project.apply(1)
        for case in cases:
            project.touch(case)
        project.cli("capture", "--until-caught-up")
        failed = {}
        for feed in feeds:
            result = project.cli("feeds", "run", feed, "--available-now", check=False)
            failed[feed] = (result.returncode, result.stderr.strip().splitlines())
        status = project.cli("status", "--json").stdout
    finally:
        project.close()
    code, lines = failed["by_note"]
    assert code == 3 and len(lines) == 1, failed
    assert lines[0].startswith("error: ") and "'note'" in lines[0] and "renamed to 'remark'" in lines[0], lines
    code, lines = failed["names"]
    assert code == 3 and len(lines) == 1, failed
    assert "'name'" in lines[0] and "dropped" in lines[0], lines
    rows = {row["feed"]: row for row in json.loads(status)["feeds"]}
    assert "renamed to 'remark'" in rows["by_note"]["problem"] and "dropped" in rows["names"]["problem"]


def test_a_change_that_needs_a_re_read_of_a_table_without_a_primary_key_stops_capture(
    pg_database, unique_name, tmp_path
):
    """Nothing after the change is acknowledged; one line names source resync; status shows it; resync recovers."""
    cases = [DdlCase("keyless", {1: "ADD COLUMN tag text DEFAULT 'x'"}, frozenset({1}))]
    project = DdlProject(pg_database, unique_name("ddk"), tmp_path, cases, rows=10)
    try:
        project.conn.execute("ALTER TABLE ddl.keyless DROP CONSTRAINT keyless_pkey")
        project.conn.execute("ALTER TABLE ddl.keyless REPLICA IDENTITY FULL")
        document = yaml.safe_load(project.config_path.read_text())
        document["sources"][project.source]["keys"] = {"ddl.keyless": ["id"]}
        document["warehouse"] = {"tables": {}}
        project.config_path.write_text(yaml.safe_dump(document))
        project.cli("capture", "--until-caught-up")
        project.apply(1)
        project.touch(cases[0])
        refused = project.cli("capture", "--until-caught-up", check=False)
        again = project.cli("capture", "--until-caught-up", check=False)
        status = json.loads(project.cli("status", "--json").stdout)
        project.cli("source", "resync", project.source, "--yes")
        project.cli("capture", "--until-caught-up")  # a fresh slot and a re-snapshot: every row with its tag
        resynced = json.loads(project.cli("status", "--json").stdout)
        tags = project.cli("log", "tail", project.topic(cases[0]), "--from-beginning", "--json").stdout
    finally:
        project.close()
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 3 and len(lines) == 1, refused.stderr
    assert "keyless" in lines[0] and "default" in lines[0] and "headwater source resync" in lines[0], lines
    assert again.returncode == 3 and again.stderr.strip().splitlines() == lines  # still refused: nothing acknowledged
    (row,) = status["sources"]
    assert "headwater source resync" in row["problem"]
    assert "problem" not in resynced["sources"][0]
    latest = {}
    for line in tags.splitlines():
        record = json.loads(line)
        if record["value"] is not None:
            latest[record["key"]["id"]] = record["value"]["after"]
    assert latest and all(after["tag"] == "x" for after in latest.values() if after is not None)


def test_ddl_applied_while_capture_is_stopped_ends_exact(pg_database, unique_name, tmp_path):
    """Two DDLs of each kind while nothing runs, changes between them: values and SCD2 versions exact after one run.

    The stream replays the first DDL's Relation while the catalog already holds the second's
    state. Before the fix: the second volatile default was never read (NULL in SCD1 and SCD2),
    the first rename claimed none (every row read again: a version more per key), and the first
    default's re-read read the second's column too (the second found nothing: a version less).
    """
    cases = [
        DdlCase(
            "add_default",
            {1: "ADD COLUMN tag1 text DEFAULT 'x1'", 2: "ADD COLUMN tag2 numeric(6,2) DEFAULT 1.5"},
            frozenset({1, 2}),
        ),
        DdlCase(
            "add_volatile",
            {1: "ADD COLUMN tag1 text DEFAULT md5(random()::text)", 2: "ADD COLUMN tag2 float8 DEFAULT random()"},
            frozenset({1, 2}),
        ),
        DdlCase("rename_column", {1: "RENAME COLUMN note TO remark", 2: "RENAME COLUMN name TO label"}),
        DdlCase("drop_column", {1: "DROP COLUMN name", 2: "DROP COLUMN ratio"}),
    ]
    project = DdlProject(pg_database, unique_name("dds"), tmp_path, cases, rows=60)
    try:
        project.cli("run", "--until-caught-up")
        before = [p for case in cases for p in project.problems(case)]
        assert not before, before
        project.apply(1)
        for case in cases:
            for _ in range(5):
                project.touch(case)
        project.apply(2)
        project.cli("run", "--until-caught-up")
        problems = [p for case in cases for p in project.problems(case)]
    finally:
        project.close()
    assert not problems, "\n".join(problems)
