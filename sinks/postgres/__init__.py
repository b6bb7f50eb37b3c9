"""The PostgreSQL tables kind: a live replica of each topic's rows, checkpoints in the same transactions."""
