"""Persistence: leases, jobs and usage minutes in one SQLite or PostgreSQL database."""
