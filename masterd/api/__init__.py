"""The master's edges: the aiohttp app, RPC method tables and their parameter schemas,
authentication, connection limits, node-event guards and the Prometheus exposition.

May import ``masterd.service`` and everything below it; nothing below imports this package.
"""
