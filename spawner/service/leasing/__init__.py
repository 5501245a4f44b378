"""Who holds which devices: the lease manager, device health, and reconciliation with the hub."""
