"""The sweep: its matrix, the load, results, the report and the coding check."""
