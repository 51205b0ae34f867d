"""Helios (§4): the pure halves of QSSF's duration estimate and Cluster Energy Saving, shared
by the master's features and the simulator."""
