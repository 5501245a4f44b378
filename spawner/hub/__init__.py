"""Hub integration: the GPU spawners, their spawn form, the service client and `gpupool up`."""
