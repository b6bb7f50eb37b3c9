"""Capture: register PostgreSQL sources, snapshot them and stream pgoutput changes into the log."""
