"""Images in: vision-language models whose language part mlx-lm runs.

The language model is mlx-lm's, the one the continuous batch runs for every request; mlx-vlm
(the `vision` extra) supplies the rest: the processor that turns images into pixels and
placeholder tokens, the vision tower and projector that turn pixels into embeddings, and the
language model's own positions for a prompt with images in it (Qwen's M-RoPE numbers an image's
tokens by row and column). A prompt with images is prefilled that way, its KV handed to the batch
as a prefix cache hit, and the row decodes beside text rows.
"""
