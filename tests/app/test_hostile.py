"""
The app against a hostile client (issue 54): every event, public or private, called over raw HTTP (the browser's
queue protocol, which gradio_client's name lookup and its own uploads would hide) with file paths it must never
hand back.

    .venv/bin/python -m pytest tests/app/test_hostile.py -q
"""

import base64
import json
import os
import time
import urllib.parse
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import serve_app

from arr_coc.app.uploads import make_room

ROOT = Path(__file__).resolve().parents[2]
SECRET = "arr-coc-secret-54"  # the marker of the .svg the probe tries to read
GIT_SECRET = "repositoryformatversion"  # a line of every .git/config
UPLOAD_CACHE_MB = 8  # the hostile server's --upload-cache-mb
MIB = 2 ** 20


def hostile_values(path: Path) -> list:
    """What a client may send for one input to name a file on the server: a plain path, a FileData, a list of one."""
    data = {"path": str(path), "orig_name": path.name, "meta": {"_type": "gradio.FileData"}}
    return [str(path), data, [data]]


def call(url: str, fn_index: int, data: list, session: str) -> list[dict]:
    """One event through gradio's queue as the page calls it (join, then read the session's stream until the event
    completes); -> its messages."""
    with httpx.Client(base_url=f"{url}/gradio_api", timeout=60) as http:
        joined = http.post("/queue/join", json=dict(data=data, fn_index=fn_index, session_hash=session,
                                                    event_data=None, trigger_id=None))
        if joined.status_code != 200:
            return [{"msg": "refused", "output": joined.text}]
        event, messages = joined.json()["event_id"], []
        with http.stream("GET", "/queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("event_id") not in (None, event):
                    continue
                messages.append(message)
                if message.get("msg") in ("process_completed", "close_stream", "unexpected_error"):
                    break
        return messages


def served_texts(url: str, value) -> list[str]:
    """Every text an output hands the client: the output itself, and each file it names, fetched as a browser would
    (a gradio file URL, or a data: URL inlined)."""
    texts = [json.dumps(value)]
    if isinstance(value, dict):
        for key in ("url", "path"):
            link = value.get(key)
            if not isinstance(link, str):
                continue
            if link.startswith("data:"):
                texts.append(base64.b64decode(link.split(",", 1)[-1] + "==").decode("latin-1"))
            elif link.startswith("http"):
                texts.append(httpx.get(link, timeout=10).text)
            else:
                texts.append(httpx.get(f"{url}/gradio_api/file={urllib.parse.quote(link)}", timeout=10).text)
        texts += [t for v in value.values() for t in served_texts(url, v)]
    elif isinstance(value, list):
        texts += [t for v in value for t in served_texts(url, v)]
    return texts


def defaults(config: dict, dependency: dict) -> list:
    """An event's inputs as a fresh page holds them, with a question in every text box (so a handler gets past its
    first check and reads the image)."""
    components = {c["id"]: c for c in config["components"]}
    values = []
    for i in dependency["inputs"]:
        component = components[i]
        value = component["props"].get("value")
        values.append("What is it?" if component["type"] == "textbox" and not value else value)
    return values


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    """The app with its temp folder moved aside, so that the probe's own folder is outside everything the app may
    serve (its working folder, its temp folder): a file read from there can only come from a hole. Its uploads are
    capped at UPLOAD_CACHE_MB."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "tmp").mkdir()
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.svg").write_text(f'<svg xmlns="http://www.w3.org/2000/svg"><text>{SECRET}</text></svg>')
    args = ("--upload-cache-mb", str(UPLOAD_CACHE_MB))
    with serve_app(root / "app.log", *args, env={"TMPDIR": str(root / "tmp")}) as url:
        yield url, outside / "secret.svg"


def test_no_event_hands_back_a_file_the_client_names(hostile_server):
    """Item 1: every event the page has (public, undocumented and private alike: gradio serves them all to anyone
    who names its index), each input in turn given the repo's .git/config or an .svg outside the served folders
    (a path, a FileData, a list of them), the others as a fresh page holds them: neither file's text ever comes back,
    in an output or in a file an output names."""
    url, svg = hostile_server
    config = httpx.get(f"{url}/config", timeout=10).json()
    dependencies = [(d.get("id", i), d) for i, d in enumerate(config["dependencies"]) if d.get("backend_fn")]
    assert len(dependencies) >= 20  # the probe reaches the examples', the tabs' and the private events
    leaks = []
    for target, marker in ((ROOT / ".git" / "config", GIT_SECRET), (svg, SECRET)):
        for fn_index, dependency in dependencies:
            for position in range(len(dependency["inputs"])):
                for value in hostile_values(target):
                    data = defaults(config, dependency)
                    data[position] = value
                    for message in call(url, fn_index, data, uuid.uuid4().hex):
                        output = (message.get("output") or {}).get("data") if isinstance(message.get("output"),
                                                                                           dict) else None
                        if output is not None and any(marker in t for t in served_texts(url, output)):
                            leaks.append((dependency.get("api_name"), position, target.name, type(value).__name__))
    assert not leaks, f"files handed back (event, input, file, as): {sorted(set(leaks))}"


def test_gradios_file_route_serves_neither_file(hostile_server):
    """The file route itself: the repo's .git/config and an .svg outside the served folders are refused."""
    url, svg = hostile_server
    for target, marker in ((ROOT / ".git" / "config", GIT_SECRET), (svg, SECRET)):
        response = httpx.get(f"{url}/gradio_api/file={urllib.parse.quote(str(target))}", timeout=10)
        assert marker not in response.text


def test_uploads_past_the_cache_cap_delete_the_oldest(hostile_server):
    """Item 6: gradio's upload route needs no event or session, so anyone can fill the cache (980 MB in 9 s). Six
    uploads of 3 MiB under an 8 MiB cap: each makes room first, so the last two alone are kept (6 MiB)."""
    url, _ = hostile_server
    paths = []
    for i in range(6):
        files = {"files": (f"upload{i}.png", os.urandom(3 * MIB), "image/png")}
        response = httpx.post(f"{url}/gradio_api/upload", files=files, timeout=30)
        assert response.status_code == 200
        paths += response.json()
    assert [Path(p).exists() for p in paths] == [False] * 4 + [True] * 2
    assert sum(Path(p).stat().st_size for p in paths[-2:]) == 6 * MIB


def test_make_room_deletes_the_oldest_until_the_incoming_bytes_fit(tmp_path):
    """Uploads of 4, 3 and 2 bytes, oldest first, and one already swept; 2 more under a cap of 10: the oldest alone
    goes (4 bytes), and the swept one leaves the set. Then 1 more fits as they are."""
    uploads = {str(tmp_path / "swept")}
    for i, size in enumerate((4, 3, 2)):
        path = tmp_path / f"u{i}"
        path.write_bytes(b"x" * size)
        os.utime(path, (time.time() - 10 + i,) * 2)
        uploads.add(str(path))
    assert make_room(uploads, incoming=2, max_bytes=10) == 4
    assert uploads == {str(tmp_path / "u1"), str(tmp_path / "u2")} and not (tmp_path / "u0").exists()
    assert make_room(uploads, incoming=1, max_bytes=10) == 0 and len(uploads) == 2
