"""CLI commands by area; each module has ``register(cli)``.

Each command parses its options and calls one library function. Command modules import the
stage libraries inside the command body: every command module is loaded to build the CLI, and
``headwater --help`` or ``status`` must not pay for pyspark, deltalake, psycopg or Dagster.
"""
