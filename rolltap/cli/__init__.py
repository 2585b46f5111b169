"""The `rolltap` command line."""
