"""gpupool: a JupyterHub spawner that turns scattered GPUs, MIG slices and shared GPUs into one pool."""

__version__ = "0.1.0"
