"""Workload sources: GENIE's synthetic mix, Philly, Alibaba openb, job files, Slurm sacct."""
