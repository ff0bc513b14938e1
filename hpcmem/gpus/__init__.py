"""GPUs: the catalog, site descriptions and per-GPU calibrations."""
