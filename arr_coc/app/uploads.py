"""
The upload cache, bounded by size as well as by age. Gradio's upload route takes files from anyone, with no event
or session, and keeps them until the age sweep (an hour by default): 980 MB arrived in 9 s. UploadCap, an ASGI
middleware in front of that route, makes room for each upload first by deleting the oldest uploads, so what the
cache holds of them stays under `max_bytes` (plus the uploads in flight, each at most the server's max_file_size).

    demo.launch(..., app_kwargs=dict(middleware=[Middleware(UploadCap, blocks=demo, max_bytes=1024 * 2**20)]))
"""

import logging
import os

log = logging.getLogger("arr_coc.app")

UPLOAD_ROUTE = "/gradio_api/upload"  # gradio's upload route (its API prefix, then /upload)


def stat(path: str) -> tuple[float, int]:
    """A file's (modification time, size); (0, 0) for one already gone (swept by age, or at shutdown)."""
    try:
        st = os.stat(path)
    except OSError:
        return 0.0, 0
    return st.st_mtime, st.st_size


def make_room(uploads: set, incoming: int, max_bytes: int) -> int:
    """
    Delete the oldest files of `uploads` (gradio's upload_file_set: the paths of the uploads it keeps) until they and
    `incoming` more bytes fit in max_bytes; each deleted one leaves the set. -> the bytes deleted.
    """
    stats = {path: stat(path) for path in list(uploads)}
    excess = sum(size for _, size in stats.values()) + incoming - max_bytes
    freed = 0
    for path in sorted(stats, key=stats.get):  # oldest first
        if freed >= excess:
            break
        try:
            os.remove(path)
        except OSError:
            pass
        uploads.discard(path)
        freed += stats[path][1]
    return freed


class UploadCap:
    """ASGI middleware: before gradio's upload route reads a body, make_room for it (its Content-Length, or the
    largest file the server takes when the client sends none)."""

    def __init__(self, app, blocks, max_bytes: int):
        self.app, self.blocks, self.max_bytes = app, blocks, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith(UPLOAD_ROUTE):
            headers = dict(scope.get("headers") or [])
            length = headers.get(b"content-length", b"")
            incoming = int(length) if length.isdigit() else (self.blocks.max_file_size or self.max_bytes)
            freed = make_room(self.blocks.upload_file_set, min(incoming, self.max_bytes), self.max_bytes)
            if freed:
                log.info("upload cache: deleted %.1f MB of the oldest uploads to stay under %.0f MB",
                         freed / 2**20, self.max_bytes / 2**20)
        await self.app(scope, receive, send)
