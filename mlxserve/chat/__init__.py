"""Chat without HTTP: messages -> the model's prompt, and the model's answer -> content, reasoning
and tool calls. No MLX and no Quart here; the tokenizer is the only model object it touches."""
