"""The PostgreSQL source kind: registration, snapshot, streaming and pgoutput decoding, events, types."""
