"""What every front door shares between its wire model and the engine: the defaults and rules a
request is read with, and (as the layer grows) the canonical request, chat preparation and
planning. No Quart here: the HTTP layer (mlxserve/api/) looks up the server's state and calls in.
"""
