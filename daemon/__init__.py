"""Everything that runs on a node: the specd daemon and the shard runtime."""
