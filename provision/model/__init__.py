"""The deployment model: what a host's deployment depends on, its tables, overrides, and how validation errors read."""
