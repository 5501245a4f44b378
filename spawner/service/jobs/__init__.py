"""Training jobs as lease owners: submission checks, the job manager, and the runners that start attempts."""
