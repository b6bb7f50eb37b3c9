"""Real services for integration tests: Postgres, a Kafka-protocol broker, Spark, and containers.

``tests/conftest.py`` turns these into lazily started, session-scoped fixtures; the
modules here hold the start/stop logic so it can also be used outside pytest.
"""
