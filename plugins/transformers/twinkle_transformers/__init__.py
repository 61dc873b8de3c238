"""twinkle-transformers: the Hugging Face Transformers backend of twinkle_core (registered via entry points)."""
