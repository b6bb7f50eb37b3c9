"""An excluded and a masked column through the whole pipeline: their values are nowhere (issue 21).

The real CLI captures a table with an excluded column (``ssn``) and a masked one (``email``, a
salted SHA-256 hash) by a snapshot, then ``headwater run --until-caught-up`` streams inserts,
updates (one leaving a TOASTed masked value unchanged), a delete and a row that goes to
quarantine, runs a feed and loads an SCD1 and an SCD2 table (one Spark session). Then every
command's output and every file under the project is searched for the raw values and the salt:
raw bytes, Parquet files read back, and every topic of the log read through the log itself
(its segments hold zstd-compressed batches a byte search cannot see into).
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import yaml
from harness.topics import read_topic

from core.config import load_config
from log.factory import open_log

SALT_VAR = "HW_CONTROLS_SALT"
SALT = "Pepper-Salt-9f2Kq7"
SSNS = [f"SSN{n:03d}-ExcludedValue-7Qz" for n in range(1, 7)]
EMAILS = [f"person{n:03d}.maskedvalue@leak-check.example" for n in range(1, 7)]
#: A TOASTed masked value (stored out of line), left unchanged by an update.
LONG_EMAIL = "long." + "x" * 3000 + ".maskedvalue@leak-check.example"


def needles() -> list[str]:
    secrets = [*SSNS, *EMAILS, LONG_EMAIL, SALT]
    # Raw, and the forms a value could be written in: hex and base64 of its bytes, and the
    # distinctive parts alone (a value cut or re-quoted keeps them).
    forms = {
        s for secret in secrets for s in (secret, secret.encode().hex(), base64.b64encode(secret.encode()).decode())
    }
    forms |= {"ExcludedValue-7Qz", "maskedvalue@leak-check", "x" * 200, "Pepper-Salt"}
    return sorted(forms, key=len, reverse=True)


def headwater(config: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "headwater", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, SALT_VAR: SALT},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"headwater {' '.join(args)}: {time.monotonic() - started:.1f} s")
    return result


def test_excluded_and_masked_values_are_nowhere(pg_database, unique_name, tmp_path, monkeypatch):
    source = unique_name("ctl")
    pg_database.execute(
        "CREATE TABLE people (id int PRIMARY KEY, name text, ssn text, email text, balance numeric(10,2));"
        "ALTER TABLE people ALTER COLUMN email SET STORAGE EXTERNAL;"
        f"CREATE PUBLICATION headwater_{source} FOR TABLE people"
    )
    for n in range(1, 4):
        pg_database.execute(
            "INSERT INTO people VALUES (%s, %s, %s, %s, %s)", (n, f"name {n}", SSNS[n - 1], EMAILS[n - 1], n * 1.5)
        )
    raw = f"{source}.public.people"
    config = tmp_path / "headwater.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "project": "controls",
                "log": {"partitions": 2},
                "sources": {
                    source: {
                        "dsn": pg_database.dsn,
                        "tables": ["public.people"],
                        "heartbeat_interval_s": 1,
                        # precise: a numeric NaN cannot be written, so that row goes to quarantine
                        "types": {"decimal_handling_mode": "precise"},
                        "columns": {
                            "exclude": ["public.people.ssn"],
                            "mask": {"public.people.email": {"hash": "sha256", "salt": f"${{{SALT_VAR}}}"}},
                        },
                        "transactions": True,
                    }
                },
                "feeds": {"people_clean": {"from": raw, "sql": "SELECT id, name, email FROM source", "key": ["id"]}},
                "warehouse": {
                    "tables": {
                        "people": {"from": "people_clean", "mode": "scd1"},
                        "people_hist": {"from": raw, "mode": "scd2"},
                    }
                },
            }
        )
    )
    outputs = [headwater(config, "capture", "--until-caught-up")]  # the snapshot (native COPY path)
    pg_database.execute(
        "INSERT INTO people VALUES (4, 'name 4', %s, %s, 4), (5, 'name 5', %s, %s, 'NaN')",
        (SSNS[3], EMAILS[3], SSNS[4], EMAILS[4]),
    )
    pg_database.execute("UPDATE people SET email = %s, ssn = %s WHERE id = 1", (LONG_EMAIL, SSNS[5]))
    pg_database.execute("UPDATE people SET name = 'renamed' WHERE id = 1")  # email unchanged: TOAST not sent
    pg_database.execute("UPDATE people SET email = %s WHERE id = 2", (EMAILS[5],))
    pg_database.execute("DELETE FROM people WHERE id = 3")
    outputs.append(headwater(config, "run", "--until-caught-up"))
    outputs.append(headwater(config, "query", "SELECT * FROM people ORDER BY id", "--format", "json"))
    outputs += [headwater(config, "log", "tail", raw, "--from-beginning", "--json"), headwater(config, "status")]

    # The pipeline carried the masked values: the hash, never the value.
    rows = orjson.loads(outputs[2].stdout)
    hashed = {n: hashlib.sha256((SALT + email).encode()).hexdigest() for n, email in enumerate(EMAILS, 1)}
    assert [(r["id"], r["name"], r["email"]) for r in rows] == [
        (1, "renamed", hashlib.sha256((SALT + LONG_EMAIL).encode()).hexdigest()),
        (2, "name 2", hashlib.sha256((SALT + EMAILS[5]).encode()).hexdigest()),
        (4, "name 4", hashed[4]),
    ]
    monkeypatch.setenv(SALT_VAR, SALT)
    loaded = load_config(config)
    log = open_log(loaded)
    try:
        topics = log.list_topics()
        assert f"{raw}.quarantine" in topics and f"{source}.transaction" in topics
        (quarantined,) = read_topic(log, f"{raw}.quarantine")
        assert orjson.loads(quarantined.value)["after_raw"] == {
            "id": "5",
            "name": "name 5",
            "email": hashed[5],
            "balance": "NaN",
        }
        records = {topic: read_topic(log, topic) for topic in topics}
    finally:
        log.close()
    # The topics were read through the log (decoded): the masked values are there, the hash of each.
    assert any(hashed[4].encode() in (record.value or b"") for record in records[raw])

    hits: list[str] = []
    wanted = needles()
    for result in outputs:
        for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            hits += [f"{stream} of headwater {' '.join(result.args[3:])}: {n[:40]!r}" for n in wanted if n in text]
    for topic, topic_records in records.items():
        for record in topic_records:
            data = b"".join([record.key or b"", record.value or b"", *(v for _, v in record.headers)])
            hits += [f"topic {topic}: {n[:40]!r}" for n in wanted if n.encode() in data]
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p != config]
    assert any(p.suffix == ".parquet" for p in files), "the warehouse was written"
    for path in files:
        data = path.read_bytes()
        if path.suffix == ".parquet":
            data += repr(pq.read_table(path).to_pylist()).encode()
        hits += [f"file {path.relative_to(tmp_path)}: {n[:40]!r}" for n in wanted if n.encode() in data]
    assert not hits, "\n".join(hits)
    assert f"${{{SALT_VAR}}}" in config.read_text()  # the config holds the reference, never the salt
