"""The one thread that runs MLX, each engine's inbox and the messages in it, and how much
prompt a step prefills beside the streams."""
