"""The resident models: loading one and reading its facts (host), its life in an engine (slot),
several within one memory budget (pool), and LoRA adapters served on a base's weights."""
