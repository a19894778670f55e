"""The one error of the models room: a model folder that cannot be loaded.

Its own module so that the loader and the quantized-checkpoint readers it calls can both raise it
without importing each other.
"""


class ModelLoadError(ValueError):
    """A model folder that cannot be loaded; the message names the file, tensor or option at fault."""
