"""hpcmem: how much memory every GPU of a TRL fine-tuning run needs, proven against measured runs, launched on SLURM."""

__version__ = "0.1.0"
