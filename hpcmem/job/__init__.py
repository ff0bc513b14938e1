"""The job: what the user asked for, read as TRL, accelerate and SLURM read it, and the rules TRL applies to it."""
