"""inferctl's bundled inference engine: Llama-family models over a paged KV cache."""

__version__ = "0.1.0"
