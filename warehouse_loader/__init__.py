"""The warehouse: table specs, SCD1/SCD2 apply, the Delta writer and the query engine."""
