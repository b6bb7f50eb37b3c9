"""Dagster Definitions built from headwater.yaml: assets, checks, sensors, schedules, jobs."""
