"""The logical-plan API: datasets (what to read) and nodes (what to compute)."""
