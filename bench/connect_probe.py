"""Spark Connect probe (issue 17): which of Headwater's Spark pieces work through ``sc://``.

Starts a Spark Connect server from pyspark's own jars (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, ``local[2]``) whose Python is this
interpreter, writes a small raw topic to a file log, and through a ``remote`` session tries:
the ``headwater_log`` Python data source (batch read, streaming read with ``foreachBatch``),
``feeds run`` and ``load`` as the CLI runs them. Prints one line per piece: OK with numbers, or
the first line of the error.

The Spark Connect client needs packages the project does not lock (``grpcio-status``,
``googleapis-common-protos``, ``zstandard``: ``pyspark[connect]``); run it with an interpreter
that has them and sees the project's dependencies, e.g. a venv with those three packages and
a ``.pth`` file naming the project venv's site-packages:

    <python with pyspark[connect]> bench/connect_probe.py [--events 20000]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from feeds_bench import TOPIC, write_source  # noqa: E402

SQL = "SELECT id, lower(name) AS name, country FROM source WHERE balance >= 0"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(base: Path) -> tuple[subprocess.Popen[bytes], int]:
    import pyspark

    home = Path(pyspark.__file__).parent
    port = free_port()
    (base / "conf").mkdir(parents=True)
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
    }
    argv = [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    argv += ["--master", "local[2]", *(x for k, v in conf.items() for x in ("--conf", f"{k}={v}"))]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(base / "conf"),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    log = base / "connect.log"
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 180
    while "Spark Connect server started" not in log.read_text(errors="replace"):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the Connect server did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)
    return server, port


def first_line(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hw-connect-probe-"))
    config_path = root / "headwater.yaml"
    body = {
        "project": "probe",
        "home": str(root / "home"),
        "log": {"partitions": 2},
        "feeds": {"clean": {"from": TOPIC, "sql": SQL, "key": ["id"]}},
        "warehouse": {"tables": {"customers": {"from": TOPIC, "mode": "scd1"}}},
    }
    config_path.write_text(yaml.safe_dump(body))
    write_source(config_path, args.events, args.events // 2)
    started = time.monotonic()
    server, port = start_server(root / "server")
    print(f"Connect server (local[2]) up in {time.monotonic() - started:.1f} s", flush=True)
    try:
        from pyspark.sql import SparkSession

        from core.config import load_config
        from log.factory import open_log
        from spark_log.data_source import log_reader

        config = load_config(config_path)
        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        print(f"remote session: {type(spark).__module__}.{type(spark).__name__}", flush=True)

        started = time.monotonic()
        try:
            count = log_reader(spark, config, TOPIC).load().count()
            elapsed = time.monotonic() - started
            print(f"data source, batch read: OK, {count:,} of {args.events:,} events in {elapsed:.1f} s")
        except Exception as exc:
            print(f"data source, batch read: FAILED {first_line(exc)}")

        marks = root / "foreach_batch.txt"

        def note(frame: object, batch_id: int) -> None:
            with open(marks, "a") as out:
                out.write(f"{batch_id} {frame.count()} pid={os.getpid()}\n")  # type: ignore[attr-defined]

        started = time.monotonic()
        try:
            stream = log_reader(spark, config, TOPIC, streaming=True).option("maxRecordsPerBatch", "5000").load()
            query = (
                stream.writeStream.foreachBatch(note)
                .option("checkpointLocation", str(root / "ckpt"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination(300)
            seen = marks.read_text().split("\n") if marks.exists() else []
            rows = sum(int(line.split()[1]) for line in seen if line)
            pids = {line.split()[2] for line in seen if line}
            print(
                f"data source, streaming + foreachBatch: OK, {len([x for x in seen if x])} micro-batches, {rows:,} "
                f"events in {time.monotonic() - started:.1f} s; foreachBatch ran in {sorted(pids)}, "
                f"the client is pid={os.getpid()}"
            )
        except Exception as exc:
            print(f"data source, streaming + foreachBatch: FAILED {first_line(exc)}")

        log = open_log(config)
        try:
            from derived_feeds.feed_job import run_feeds

            started = time.monotonic()
            try:
                run_feeds(spark, config, log, ["clean"], available_now=True)
                written = sum(log.end_offset("clean", p) for p in range(2))
                print(f"feeds run: OK, {written:,} records in {time.monotonic() - started:.1f} s")
            except Exception as exc:
                print(f"feeds run: FAILED {first_line(exc)}")
            from warehouse_loader.load_job import run_loads, table_path

            started = time.monotonic()
            try:
                run_loads(spark, config, log, ["customers"], available_now=True)
                table = table_path(config, "customers").open()
                rows = table.to_pyarrow_table(columns=["id"]).num_rows if table is not None else 0
                print(f"load (SCD1): OK, {rows:,} rows in {time.monotonic() - started:.1f} s")
            except Exception as exc:
                print(f"load (SCD1): FAILED {first_line(exc)}")
        finally:
            log.close()
        spark.stop()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
