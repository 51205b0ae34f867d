"""trellis-masterd: the master service.

Layers, each importing only those above it in this list: ``shared`` (wire protocol, data
model), ``masterd.core`` (the pure scheduling core), ``masterd.journal`` (durable state),
``masterd.runtime`` (the narrow interface features get), ``masterd.features`` (one module
or package per feature), ``masterd.service`` (the master that drives the core and hosts the
features), ``masterd.api`` (HTTP, RPC, node WebSocket), and ``masterd.main`` (the daemon).
tests/unit/test_masterd_layers.py holds the code to these rules.
"""
