"""Deploying shards onto Ray nodes by label, and reaching them from the serving process."""
