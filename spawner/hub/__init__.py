"""Hub integration: the spawn form and, later, the GPU spawners JupyterHub runs."""
