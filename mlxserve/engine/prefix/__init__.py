"""The prefix cache: prompts' KV kept in memory and on disk, reused by later prompts."""
