"""Registering a PostgreSQL source: prerequisites, publication, slot, row filters, settings."""
