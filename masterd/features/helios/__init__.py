"""Helios (§4) in the live master: QSSF's duration estimator and Cluster Energy Saving.

``estimator``: attaches each waiting job's duration estimate (rolling + LightGBM) for the
``qssf`` policy and keeps its accuracy; ``trainer``: what the worker process runs (reads the
journal, fits, writes the model files); ``power``: the power manager (forecast, Algorithm 2,
suspend and resume programs).
"""
