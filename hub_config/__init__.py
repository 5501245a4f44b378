"""Ready configurations shipped with gpupool: pools, profiles and hub settings."""
