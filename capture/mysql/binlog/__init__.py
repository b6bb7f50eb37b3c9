"""The MySQL/MariaDB binlog: positions, event parsing, table maps, row images, the replication client."""
