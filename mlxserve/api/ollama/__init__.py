"""Ollama's native API (/api/*), for the Mac apps and plugins that speak only Ollama."""
