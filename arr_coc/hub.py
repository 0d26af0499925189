"""
Whether the HuggingFace hub can be asked now, and going offline when it cannot: one quick probe instead of
transformers' and datasets' retries (about 35 s each) for nothing. A utility under every command and set loader.

    reason = hub_out_of_reach()   # None: the hub answers; else why not (the process is now offline)
"""

import sys

HUB_TIMEOUT_S = 3.0  # how long the hub may take to answer before a command goes offline
_OFFLINE: dict[str, str] = {}  # "reason": why this process went offline (go_offline), for the messages


def hub_out_of_reach() -> str | None:
    """
    Why the hub cannot be asked now, or None when it answers: HF_HUB_OFFLINE=1, or no answer to one request
    within HUB_TIMEOUT_S. Out of reach, the process goes offline (go_offline), so that transformers and datasets
    read their local caches at once instead of waiting out their retries (about 35 s) for nothing.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return _OFFLINE.get("reason", "HF_HUB_OFFLINE=1 is set")
    if hub_answers(constants.ENDPOINT):
        return None
    go_offline(f"the hub ({constants.ENDPOINT}) cannot be reached")
    return _OFFLINE["reason"]


def hub_answers(endpoint: str, timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the hub answers one HEAD request, whatever its status, within `timeout` (proxies as configured)."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=timeout)
        return True
    except Exception:  # no network, no name resolution, a refusing proxy, a timeout: nothing would load from there
        return False


def go_offline(reason: str) -> None:
    """This process from now on as under HF_HUB_OFFLINE=1: huggingface_hub and transformers read the flag at each
    request; datasets copies it when imported, so an imported one is told too."""
    from huggingface_hub import constants

    _OFFLINE["reason"] = reason
    constants.HF_HUB_OFFLINE = True
    if (datasets := sys.modules.get("datasets")) is not None:
        datasets.config.HF_HUB_OFFLINE = True
