"""What a run leaves in its directory (summary.json, metrics.jsonl) and who may write there."""
