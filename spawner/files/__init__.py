"""Reading the YAML files the hub is configured with: pool files, profiles files and what they share."""
