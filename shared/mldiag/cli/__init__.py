"""The `mldiag` command line."""
