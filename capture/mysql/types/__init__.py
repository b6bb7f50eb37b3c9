"""MySQL/MariaDB column types and their values as Debezium's MySQL connector writes them."""
