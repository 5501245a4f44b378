"""The gpupool service: the lease store and manager (persistence, queueing, restore) and its HTTP API."""
