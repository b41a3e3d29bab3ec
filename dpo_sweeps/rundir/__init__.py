"""What a run leaves in its directory and who may write there, one concern a module: summary.json
(summary), metrics.jsonl (metrics_log), the ranks' failure records (rank_failures), what defines a run
(hashing), atomic JSON (atomic), an attempt's cost (cost), .hydra/
(hydra_record), the directory's lock (lock) and the paths a run writes (paths)."""
