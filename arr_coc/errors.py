"""
The errors a user can cause or meet, which the app shows as they are and the commands turn into exit code 2.
Torch-free, so the commands can name them before anything heavy loads.

    raise InputError("the question is empty: type a question about the image")
"""


class InputError(ValueError):
    """Bad user input (image, question, dataset, flag values): the message is shown to the user as it is."""


class OutOfMemory(RuntimeError):
    """CUDA ran out of memory; the memory was freed and the model is ready for the next request."""
