"""Notebook side of gpupool: widgets and a client of the gpupool service (arrives with the hub)."""
