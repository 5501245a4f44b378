"""The pool domain: devices, MIG geometry, requests, pool state and placement policies (no I/O)."""
