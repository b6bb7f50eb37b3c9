"""Derived feeds on Spark: the log data source, feed specs, transforms, expectations, reprocessing."""
