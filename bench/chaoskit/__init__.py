"""The chaos soak's parts (bench/chaos.py): the job that writes its own evidence, the history
of client operations, the nemesis, the workload and the checker that trusts only those."""
