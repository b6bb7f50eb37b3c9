"""PostgreSQL's types: text values -> Debezium JSON values of each logical type."""
