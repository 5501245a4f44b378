"""The gpupool service: the lease store and manager (persistence, queueing, restore); HTTP comes later."""
