"""CLI commands by area; each module has ``register(cli)``."""
