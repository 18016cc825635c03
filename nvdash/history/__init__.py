"""The on-disk history: writer, tiers, retention, queries, nvidia-smi CSV import/export and replay."""
