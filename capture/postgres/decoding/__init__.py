"""The replication protocol's frames and pgoutput messages decoded into value objects."""
