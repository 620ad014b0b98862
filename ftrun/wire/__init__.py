"""The control plane's wire: what crosses a connection between controller, agents and clients.

    protocol.py  framing, the handshake and the authenticated channel
    messages.py  each role's message kinds and their schemas, checked on receipt
    schema.py    the field types, bounds and shared fields the schemas are written in

Ground floor: imports nothing above it.
"""
