"""
The app against a hostile client (issue 54): every event, public or private, called over raw HTTP (the browser's
queue protocol, which gradio_client's name lookup and its own uploads would hide) with file paths it must never
hand back.

    .venv/bin/python -m pytest tests/app/test_hostile.py -q
"""

import base64
import json
import os
import re
import time
import urllib.parse
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import serve_app

from PIL import Image

from arr_coc.app.ui import NOT_UPLOADED
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
    completes); -> its messages. The body is Python's JSON, which writes NaN and Infinity as a raw client may (httpx's
    own encoder refuses them)."""
    body = json.dumps(dict(data=data, fn_index=fn_index, session_hash=session, event_data=None, trigger_id=None))
    with httpx.Client(base_url=f"{url}/gradio_api", timeout=120) as http:
        joined = http.post("/queue/join", content=body, headers={"content-type": "application/json"})
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


def bare_values(path: Path) -> list:
    """What gradio itself lets through to the app (issue 68, F1): it checks only FileData dicts whose meta names
    gradio.FileData, so a dict with a bare path (and whatever else), a URL in place of a path, and lists of them
    reach the component's preprocess as given."""
    bare = {"path": str(path)}
    return [bare, {"path": str(path), "orig_name": "cat.png", "url": None}, {"path": f"file://{path}"},
            {"path": None, "url": f"http://127.0.0.1:9/{path.name}"}, [bare]]


def refusals(url: str, config: dict, dependency: tuple, position: int, value) -> list[str]:
    """One event, `value` at input `position`, the others as a fresh page holds them -> every text its messages
    hand back (outputs, errors, and the files the outputs name)."""
    fn_index, dep = dependency
    data = defaults(config, dep)
    data[position] = value
    texts = []
    for message in call(url, fn_index, data, uuid.uuid4().hex):
        output = message.get("output")
        if isinstance(output, dict):
            texts += [str(output.get("error"))] + served_texts(url, output.get("data"))
    return texts


def test_a_bare_path_reads_no_server_file_and_tells_nothing_of_it(hostile_server):
    """F1: every event with a file input (an image or a checkpoint), sent a FileData without `meta` (and the other
    shapes bare_values lists) naming a PNG outside every served folder: none reads it (its size, 333 x 217, never
    comes back) and each refuses with the app's one line, the same for that PNG, a text file, a folder and a path
    with nothing there (no oracle of what the server holds). Fails on a88636a: the stats stream '333 x 217 px'."""
    url, svg = hostile_server
    outside = svg.parent
    Image.new("RGB", (333, 217), (12, 200, 34)).save(outside / "private.png")
    (outside / "notes.txt").write_text("not an image")
    targets = [outside / "private.png", outside / "notes.txt", outside, outside / "nothing-here.png"]
    config = httpx.get(f"{url}/config", timeout=10).json()
    kinds = {c["id"]: c["type"] for c in config["components"]}
    inputs = [((d.get("id", i), d), position) for i, d in enumerate(config["dependencies"]) if d.get("backend_fn")
              for position, component in enumerate(d["inputs"]) if kinds[component] in ("image", "file")]
    assert len({dep[0] for dep, _ in inputs}) >= 9  # compare, microscope, kept_cells, faithfulness, where_it_looks,
    # converse, ab (twice), and the uploads' own events
    leaks, answers = [], {}
    for dependency, position in inputs:
        for shape in range(len(bare_values(targets[0]))):
            for target in targets:
                texts = refusals(url, config, dependency, position, bare_values(target)[shape])
                if any("333 x 217" in t or "333x217" in t for t in texts):
                    leaks.append((dependency[1].get("api_name"), position, shape))
                errors = [t for t in texts if NOT_UPLOADED in t]
                answer = errors[0] if errors else re.sub(r"input_value=.*?, input_type", "", " | ".join(texts))
                answers.setdefault((dependency[0], position, shape), set()).add(answer[:300])
    assert not leaks, f"a server file was read (event, input, shape): {leaks}"
    told = {key: seen for key, seen in answers.items() if len(seen) != 1}
    assert not told, f"answers that depend on what is at the path (event, input, shape): {told}"
    # a shape gradio's own types refuse (a list for one image, one file for a list) never reaches the app; every
    # other reaches cached_file and gets its line
    wrong = {key: seen for key, seen in answers.items() if seen != {NOT_UPLOADED} and
             "an input was refused: " not in next(iter(seen))}
    assert not wrong, f"events that did not answer a bare path with the one line: {wrong}"


def uploaded(url: str, path: Path) -> dict:
    """A file uploaded as the page uploads it -> the FileData that names it in gradio's cache."""
    with path.open("rb") as f:
        cached = httpx.post(f"{url}/gradio_api/upload", files={"files": (path.name, f, "image/png")}, timeout=30)
    return {"path": cached.json()[0], "orig_name": path.name, "meta": {"_type": "gradio.FileData"}}


def answers(messages: list[dict]) -> list:
    """The last output an event streamed, or its error."""
    done = [m for m in messages if m.get("msg") == "process_completed"]
    output = done[-1].get("output") or {} if done else {}
    return output.get("data") or [output.get("error")]


NUMBER_EVENTS = ("compare", "microscope", "where_it_looks", "reselect", "converse", "faithfulness", "ab", "redraw",
                 "kept_cells")


def test_a_number_that_is_not_finite_is_one_line_naming_it(hostile_server):
    """F2 (and issue 66): NaN, Infinity and -Infinity posted as JSON numbers over the queue API, in each number
    input of each event in turn (the others as a fresh page holds them, the cat uploaded as its image): a one-line
    error naming the slider by its label, never "unexpected error"; and /compare answers afterwards exactly as
    before. Fails on a88636a: "Unexpected error (ValueError: cannot convert float NaN to integer)"."""
    url, _ = hostile_server
    config = httpx.get(f"{url}/config", timeout=10).json()
    kinds = {c["id"]: c["type"] for c in config["components"]}
    labels = {c["id"]: c["props"].get("label") for c in config["components"]}
    cat = uploaded(url, ROOT / "assets" / "chelsea.png")
    events = {d.get("api_name"): (d.get("id", i), d) for i, d in enumerate(config["dependencies"])
              if d.get("api_name") in NUMBER_EVENTS}
    assert set(events) == set(NUMBER_EVENTS)

    def page(name: str) -> list:
        data = defaults(config, events[name][1])
        return [cat if kinds[c] == "image" else value for c, value in zip(events[name][1]["inputs"], data)]

    texts = [p for p, c in enumerate(events["compare"][1]["outputs"]) if kinds[c] == "textbox"]  # the two answers

    def compared() -> list:
        out = answers(call(url, events["compare"][0], page("compare"), uuid.uuid4().hex))
        return [out[p] for p in texts]

    before = compared()
    assert len(before) == 2 and all(before)
    wrong = []
    for name, (fn_index, dependency) in events.items():
        numbers = [p for p, c in enumerate(dependency["inputs"]) if kinds[c] in ("slider", "number")]
        assert numbers, name
        for position in numbers:
            for value in (float("nan"), float("inf"), float("-inf")):
                data = page(name)
                data[position] = value
                error = str(answers(call(url, fn_index, data, uuid.uuid4().hex))[-1])
                label = re.escape(labels[dependency["inputs"][position]])
                if not re.fullmatch(rf"{label} must be (a finite number|between \S+ and \S+), got {value}", error):
                    wrong.append((name, position, value, error[:120]))
    assert not wrong, f"not one line naming the number (event, input, value, error): {wrong}"
    assert compared() == before


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


def test_one_request_of_many_files_stays_under_the_cap(hostile_server):
    """F5: one upload request of ten 2 MiB files (20 MiB, past the 8 MiB cap): once it is answered, what the cache
    keeps of them is under the cap (the oldest deleted at once, not at the next upload), the last one kept. Failed
    before: all ten (20 MiB) stayed until another upload came."""
    url, _ = hostile_server
    files = [("files", (f"many{i}.png", os.urandom(2 * MIB), "image/png")) for i in range(10)]
    response = httpx.post(f"{url}/gradio_api/upload", files=files, timeout=60)
    assert response.status_code == 200
    kept = [Path(p) for p in response.json() if Path(p).exists()]
    assert sum(p.stat().st_size for p in kept) <= UPLOAD_CACHE_MB * MIB
    assert Path(response.json()[-1]) in kept and len(kept) < 10


def test_one_session_cannot_fill_the_queue(hostile_server):
    """F6: twelve /compare joins from one session that never reads its stream: at most --session-jobs (4) wait
    beside the one running, the rest are refused with HTTP 429 and one line; another session's /compare then
    answers. Before: all 200 of such joins were taken and a lone user waited minutes."""
    url, _ = hostile_server
    config = httpx.get(f"{url}/config", timeout=10).json()
    index, compare = next((d.get("id", i), d) for i, d in enumerate(config["dependencies"])
                          if d.get("api_name") == "compare")
    kinds = {c["id"]: c["type"] for c in config["components"]}
    cat = uploaded(url, ROOT / "assets" / "chelsea.png")
    data = [cat if kinds[c] == "image" else v for c, v in zip(compare["inputs"], defaults(config, compare))]
    flood = uuid.uuid4().hex
    with httpx.Client(base_url=f"{url}/gradio_api", timeout=30) as http:
        joins = [http.post("/queue/join", json=dict(data=data, fn_index=index, session_hash=flood, event_data=None,
                                                     trigger_id=None)) for _ in range(12)]
    refused = [j for j in joins if j.status_code == 429]
    assert 4 <= 12 - len(refused) <= 6 and refused  # 4 waiting, beside the one running (or one that ended meanwhile)
    assert {j.json()["detail"] for j in refused} == {"this session already has 4 requests waiting: wait for them, "
                                                     "or stop one"}
    assert answers(call(url, index, data, uuid.uuid4().hex))[0].startswith("Done in")


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


def test_every_refusal_above_was_one_line_in_the_console(hostile_server):
    """F3, after every probe of this module (it runs last): gradio's own refusals (a value of the wrong shape, a
    FileData outside the cache, a number out of range) and the app's each left one line in the console, and no
    traceback. Before the fix, each of gradio's printed ~25 lines."""
    url, svg = hostile_server
    config = httpx.get(f"{url}/config", timeout=10).json()
    kinds = {c["id"]: c["type"] for c in config["components"]}
    dropdowns = [(d.get("id", i), p, d) for i, d in enumerate(config["dependencies"]) if d.get("api_name") == "compare"
                 for p, c in enumerate(d["inputs"]) if kinds[c] == "dropdown"]
    for fn_index, position, dependency in dropdowns:  # a choice the page never offers
        data = defaults(config, dependency)
        data[position] = "no-such-choice"
        assert "not in the list of choices" in str(answers(call(url, fn_index, data, uuid.uuid4().hex))[-1])
    log = (svg.parent.parent / "app.log").read_text()
    assert "user error: " in log and "Traceback" not in log, log[log.find("Traceback") - 300:][:3000]
