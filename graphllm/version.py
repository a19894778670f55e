"""graphllm's version, in a module of its own so that any layer can read it without importing the
root package (which exports the runtime's Engine)."""

__version__ = "0.1.0"
