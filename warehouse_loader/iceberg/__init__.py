"""Iceberg warehouse tables: the SCD1/SCD2 engine committed as copy-on-write Iceberg snapshots (pyiceberg)."""
