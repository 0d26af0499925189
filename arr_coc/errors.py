"""
The errors a user can cause or meet, which the app shows as they are and the commands turn into exit code 2.
Torch-free, so the commands can name them before anything heavy loads.

    raise InputError("the question is empty: type a question about the image")
"""


class InputError(ValueError):
    """Bad user input (image, question, dataset, flag values): the message is shown to the user as it is."""


class ModelOffline(InputError):
    """A hub model that cannot be loaded: the hub is out of reach (or HF_HUB_OFFLINE=1) and the local cache lacks it."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason  # why the hub was not asked, e.g. "HF_HUB_OFFLINE=1 is set"


class OutOfMemory(RuntimeError):
    """CUDA ran out of memory; the memory was freed and the model is ready for the next request."""


class Stopped(RuntimeError):
    """The user stopped the request (the app's Stop): its generation ended at the next token, nothing was answered."""


def check_text(text: str, what: str) -> str:
    """`text` as it is, or InputError where it is no valid Unicode: a lone surrogate (a browser or a shell can send
    one; Python keeps undecodable bytes of argv so) cannot be encoded, so no tokenizer takes it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"the {what} is not valid text: a lone surrogate (U+{ord(text[e.start]):04X}) at character "
                         f"{e.start + 1}") from None
    return text
