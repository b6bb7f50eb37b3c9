"""The harness's services are real: a pgoutput slot, a Kafka round trip, a Spark query.

The container variants run the same proofs against testcontainers services and skip
where no Docker engine answers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from harness.broker import KAFKA_PYTHON_GROUP_SETTINGS
from psycopg import sql


def slot_round_trip(connect, unique_name) -> None:
    """Create a publication and pgoutput slot, insert a row, and find its bytes in the slot's changes."""
    publication, slot = unique_name("pub"), unique_name("slot")
    marker = f"harness-{unique_name('value')}"
    with connect() as conn:
        conn.execute("CREATE TABLE harness_items (id int PRIMARY KEY, label text)")
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE harness_items").format(sql.Identifier(publication)))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            conn.execute("INSERT INTO harness_items VALUES (1, %s)", (marker,))
            rows = conn.execute(
                "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
                "'proto_version', '1', 'publication_names', %s)",
                (slot, publication),
            ).fetchall()
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    messages = [bytes(data) for (data,) in rows]
    # pgoutput: Begin, Relation, Insert, Commit; the Insert carries the text value verbatim.
    assert [m[:1] for m in messages] == [b"B", b"R", b"I", b"C"]
    assert marker.encode() in messages[2]


def kafka_round_trip(bootstrap_servers: str, unique_name, consumer_settings: dict) -> float:
    """Produce one keyed record, consume it in a fresh group; returns how long the group took."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    topic, group = unique_name("topic"), unique_name("group")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all")
    try:
        producer.send(topic, key=b'{"id": 42}', value=b'{"op": "c"}').get(timeout=10)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap_servers, group_id=group, auto_offset_reset="earliest", **consumer_settings
    )
    try:
        started, received = time.monotonic(), []
        while not received and time.monotonic() - started < 30:
            for batch in consumer.poll(timeout_ms=200).values():
                received += batch
        took = time.monotonic() - started
    finally:
        consumer.close()
    assert [(r.key, r.value) for r in received] == [(b'{"id": 42}', b'{"op": "c"}')]
    return took


# -- local processes -----------------------------------------------------------------------


def test_pg_server_is_logical_and_in_an_unusual_timezone(pg_server) -> None:
    assert pg_server.execute("SHOW wal_level") == [("logical",)]
    assert pg_server.execute("SHOW timezone") == [("Pacific/Chatham",)]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root has to drop privileges")
def test_postgres_runs_unprivileged_under_root(pg_server) -> None:
    pid = (pg_server.data_dir / "postmaster.pid").read_text().splitlines()[0]
    owner = subprocess.run(["ps", "-o", "user=", "-p", pid], capture_output=True, text=True, check=True).stdout
    assert owner.strip() == "nobody"


def test_pgoutput_slot_in_a_per_test_database(pg_database, unique_name) -> None:
    slot_round_trip(pg_database.connect, unique_name)


def test_pg_database_drop_removes_its_slots(pg_server, unique_name) -> None:
    from harness.postgres import PgDatabase

    database = PgDatabase(pg_server, unique_name("db"))
    pg_server.create_database(database.name)
    database.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (unique_name("slot"),))
    database.drop()
    assert (
        pg_server.execute(sql.SQL("SELECT 1 FROM pg_database WHERE datname = {}").format(sql.Literal(database.name)))
        == []
    )
    assert (
        pg_server.execute(
            sql.SQL("SELECT 1 FROM pg_replication_slots WHERE database = {}").format(sql.Literal(database.name))
        )
        == []
    )


def test_passwords_are_checked(pg_database, unique_name) -> None:
    role = unique_name("role")
    pg_database.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'right'").format(sql.Identifier(role)))
    try:
        with psycopg.connect(pg_database.dsn_for(role, "right")) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (role,)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(pg_database.dsn_for(role, "wrong"))
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(pg_database.dsn_for("postgres", "wrong"))
    finally:
        pg_database.drop()
        pg_database.server.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_keyed_message_round_trips_through_the_broker(kafka_broker, unique_name) -> None:
    assert kafka_broker.consumer_settings == KAFKA_PYTHON_GROUP_SETTINGS
    took = kafka_round_trip(kafka_broker.bootstrap_servers, unique_name, kafka_broker.consumer_settings)
    assert took < 10, "the group join should take ~1 s with the documented settings, not tansu's default ~23 s"


def test_spark_runs_a_query(spark) -> None:
    assert spark.range(10).selectExpr("sum(id)").collect()[0][0] == 45
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


def test_unique_names_are_safe_and_distinct(unique_name) -> None:
    names = {unique_name("Weird-Prefix.x" * 10) for _ in range(3)} | {unique_name("9lives")}
    assert len(names) == 4
    for name in names:
        assert len(name) <= 63
        assert name[0].isalpha()
        assert name == name.lower()
        assert name.replace("_", "").isalnum()


# -- container variants: the same proofs against testcontainers services ---------------------


def test_pgoutput_slot_in_a_postgres_container(pg_container, unique_name) -> None:
    slot_round_trip(lambda: psycopg.connect(pg_container.dsn, autocommit=True), unique_name)


def test_keyed_message_round_trips_through_a_kafka_container(kafka_container, unique_name) -> None:
    kafka_round_trip(kafka_container.bootstrap_servers, unique_name, {})


# -- MariaDB ---------------------------------------------------------------------------------


def test_mariadb_server_is_a_binlog_source_in_an_unusual_timezone(mariadb_database) -> None:
    (row,) = mariadb_database.execute(
        "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, @@server_id, "
        "@@gtid_strict_mode, @@time_zone, TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW()) IN (765, 825)"
    )
    assert row == (1, "ROW", "FULL", "FULL", 1, 1, "Pacific/Chatham", 1)


def test_mariadb_runs_unprivileged_and_writes_row_events(mariadb_database) -> None:
    import pwd

    server = mariadb_database.server
    owner = pwd.getpwuid(os.stat(f"/proc/{server.pid}").st_uid).pw_name
    assert owner == ("nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name)
    (before,) = mariadb_database.execute("SHOW MASTER STATUS")
    mariadb_database.script("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'x')")
    events = mariadb_database.execute(f"SHOW BINLOG EVENTS IN '{before[0]}' FROM {before[1]}")
    kinds = [event[2] for event in events]
    assert "Gtid" in kinds and "Table_map" in kinds and "Write_rows_v1" in kinds, kinds


def test_mariadb_dies_with_the_process_that_started_it(tmp_path) -> None:
    # The starter is SIGKILLed: no cleanup code of it runs, the kernel's parent-death signal must.
    script = (
        "import sys, tempfile, pathlib\n"
        "sys.path.insert(0, 'tests')\n"
        "from operations.embedded_mariadb import EmbeddedMariaDB\n"
        "s = EmbeddedMariaDB(pathlib.Path(tempfile.mkdtemp(prefix='hw-mariadb-kill-'))).start()\n"
        "print(s.pid, s.base_dir, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    starter = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    pid_text, base_dir = starter.stdout.readline().split()
    pid = int(pid_text)
    assert Path(f"/proc/{pid}").exists()
    starter.kill()
    starter.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    shutil.rmtree(base_dir, ignore_errors=True)
    assert gone, f"mariadbd {pid} outlived its parent"


def test_a_sigkilled_worker_leaves_no_postgres_running(tmp_path) -> None:
    # pg_ctl daemonises the server, so no parent-death signal reaches it: the harness's reaper must.
    script = (
        "import sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from harness.postgres import start_pg_server\n"
        "server, _ = start_pg_server()\n"
        "pid = int((server.data_dir / 'postmaster.pid').read_text().split()[0])\n"
        "print(pid, server.data_dir, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    starter = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    pid_text, data_dir = starter.stdout.readline().split()
    pid = int(pid_text)
    assert Path(f"/proc/{pid}").exists()
    starter.kill()
    starter.wait()
    deadline = time.monotonic() + 30
    while (Path(f"/proc/{pid}").exists() or Path(data_dir).exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), f"postgres {pid} outlived the process that started it"
    assert not Path(data_dir).exists(), f"{data_dir} was left behind"
