"""Developer tools: local servers for examples and tests (not on the data path)."""
