"""Token shards: reading, validating, writing, downloading FineWeb and tokenising local text."""
