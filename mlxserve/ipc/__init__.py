"""The engine in a process of its own: the message schema between the front (HTTP, planning,
responses) and the engine process (MLX), the engine process's loop, and the front's supervisor
and stand-ins for the engines and their pool."""
