"""Change events and schema records from a PostgreSQL source's rows and relations."""
