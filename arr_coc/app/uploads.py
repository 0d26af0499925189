"""
What anyone may ask of the server, bounded: the upload cache, by size as well as by age (UploadCap), and the queue,
by the events one session may have waiting (SessionBound; the whole queue's bound is gradio's own max_size).

Gradio's upload route takes files from anyone, with no event
or session, and keeps them until the age sweep (an hour by default): 980 MB arrived in 9 s. UploadCap, an ASGI
middleware in front of that route, makes room for each upload first by deleting the oldest uploads, so what the
cache holds of them stays under `max_bytes` (plus the uploads in flight, each at most the server's max_file_size).

    demo.launch(..., app_kwargs=dict(middleware=[Middleware(UploadCap, blocks=demo, max_bytes=1024 * 2**20),
                                                 Middleware(SessionBound, blocks=demo, per_session=4)]))
"""

import json
import logging
import os

log = logging.getLogger("arr_coc.app")

UPLOAD_ROUTE = "/gradio_api/upload"  # gradio's upload route (its API prefix, then /upload)
JOIN_ROUTE = "/gradio_api/queue/join"  # where a client puts an event in gradio's queue


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
    largest file the server takes when the client sends none); after it, make_room again, for nothing more: one
    request of many files (or a chunked body, which names no length) may bring more than the cap, and the oldest
    of what the cache then holds go at once, not at the next upload (issue 68, F5)."""

    def __init__(self, app, blocks, max_bytes: int):
        self.app, self.blocks, self.max_bytes = app, blocks, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith(UPLOAD_ROUTE):
            headers = dict(scope.get("headers") or [])
            length = headers.get(b"content-length", b"")
            incoming = int(length) if length.isdigit() else (self.blocks.max_file_size or self.max_bytes)
            self.trim(min(incoming, self.max_bytes))

            async def trimmed_send(message):  # the body is stored by now: trim before the client hears of it
                if message["type"] == "http.response.start":
                    self.trim(0)
                await send(message)
            return await self.app(scope, receive, trimmed_send)
        await self.app(scope, receive, send)

    def trim(self, incoming: int) -> None:
        freed = make_room(self.blocks.upload_file_set, incoming, self.max_bytes)
        if freed:
            log.info("upload cache: deleted %.1f MB of the oldest uploads to stay under %.0f MB",
                     freed / 2**20, self.max_bytes / 2**20)


def waiting(blocks, session: str) -> int:
    """How many events of one session wait in gradio's queue (not yet running)."""
    queues = getattr(blocks._queue, "event_queue_per_concurrency_id", {}).values()
    return sum(event.session_hash == session for queue in queues for event in queue.queue)


class SessionBound:
    """
    ASGI middleware: a queue join from a session that already has `per_session` events waiting is refused (HTTP
    429, one line) before gradio reads it. Gradio bounds the whole queue (max_size) but not one client: 200 joins
    from one session, never reading their results, held a lone user's request back for minutes and doubled the
    app's memory (issue 68, F6). A client that forges a new session for each join is bounded by max_size alone.
    """

    def __init__(self, app, blocks, per_session: int):
        self.app, self.blocks, self.per_session = app, blocks, per_session

    async def __call__(self, scope, receive, send):
        if not (scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith(JOIN_ROUTE)):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:  # a join's body is small JSON; read it whole, then hand gradio the same bytes
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        try:
            session = json.loads(body).get("session_hash")
        except (ValueError, AttributeError):
            session = None
        if isinstance(session, str) and waiting(self.blocks, session) >= self.per_session:
            log.warning("user error: a session with %d events waiting asked for another", self.per_session)
            return await refuse(send, f"this session already has {self.per_session} requests waiting: wait for "
                                      "them, or stop one")
        replayed = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def replay():
            return next(replayed, None) or await receive()
        await self.app(scope, replay, send)


async def refuse(send, detail: str, status: int = 429) -> None:
    """An HTTP error whose JSON body is {"detail": one line}, as FastAPI's own errors are."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
