"""The HTTP layer: Quart routes, request/response models, errors. Never imports mlx."""
