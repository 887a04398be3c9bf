"""CLI command groups, one module per area."""
