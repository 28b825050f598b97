"""Where work runs: the catalogue of node reports and the best-of-k choice over it."""
