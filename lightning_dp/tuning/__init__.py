"""Private hyperparameter tuning: candidates trained under DP, one chosen privately, the cost on the run's ledger."""
