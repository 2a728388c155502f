"""`provision verify`: a pytest-testinfra suite run over the inventory's hosts (checks/)."""
