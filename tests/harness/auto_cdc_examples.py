"""The Databricks AUTO CDC documentation's example change feed, shared by the SCD golden tests."""

#: userId, name, city, operation, sequenceNum: verbatim from the documentation.
DOC_FEED = [
    (124, "Raul", "Oaxaca", "INSERT", 1),
    (123, "Isabel", "Monterrey", "INSERT", 1),
    (125, "Mercedes", "Tijuana", "INSERT", 2),
    (126, "Lily", "Cancun", "INSERT", 2),
    (123, None, None, "DELETE", 6),
    (125, "Mercedes", "Guadalajara", "UPDATE", 6),
    (125, "Mercedes", "Mexicali", "UPDATE", 5),
    (123, "Isabel", "Chihuahua", "UPDATE", 5),
]
