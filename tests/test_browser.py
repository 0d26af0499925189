"""
The three tabs in a real browser: headless Chromium, driven by Playwright, against `python app.py --model tiny`.
Compare: uploads an example image, asks a question, clicks Compare, waits for both streamed answers, checks
the heatmap and both stats tables are shown. Microscope and Checkpoint A/B: runs each once and checks its
result. A screenshot of each tab goes to out/screenshots/ (with UPDATE_SCREENSHOTS=1, to docs/screenshots/,
the README's pictures: small palette PNGs).

    apt-get install -y chromium   # skipped without /usr/bin/chromium
    .venv/bin/python -m pytest tests/test_browser.py -q
    UPDATE_SCREENSHOTS=1 .venv/bin/python -m pytest tests/test_browser.py -q   # refresh the README's screenshots
"""

import io
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAT = str(ROOT / "assets" / "chelsea.png")
QUESTION = "What colour are the cat's eyes?"

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 120_000
SHOTS = ROOT / ("docs" if os.environ.get("UPDATE_SCREENSHOTS") == "1" else "out") / "screenshots"
MAX_SHOT_BYTES = 300_000


def screenshot(page, name: str) -> Path:
    """The page as a palette PNG at most 1200 px wide, so the README's pictures stay small."""
    from PIL import Image

    image = Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("RGB")
    image.thumbnail((1200, 2400))
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    image.quantize(128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not CHROMIUM.exists(), reason=f"needs {CHROMIUM} (apt-get install chromium)")]


def test_every_tab_in_the_browser(app_url):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(app_url)
        page.locator("#compare-image input[type=file]").set_input_files(CAT)
        expect(page.locator("#compare-image img")).to_be_visible(timeout=TIMEOUT_MS)  # the upload's preview
        page.locator("#compare-question textarea").fill(QUESTION)
        page.locator("#compare-run").click()

        expect(page.locator("#compare-status")).to_contain_text("Done in", timeout=TIMEOUT_MS)
        for answer in ("#baseline-answer textarea", "#arr-answer textarea"):
            expect(page.locator(answer)).not_to_have_value("")
        heatmap = page.locator("#arr-heatmap img")
        expect(heatmap).to_be_visible()
        assert heatmap.evaluate("img => img.naturalWidth") > 0  # decoded, not a broken image
        for table in ("#baseline-stats", "#arr-stats"):
            expect(page.locator(table)).to_be_visible()
            expect(page.locator(table)).to_contain_text("visual tokens: saccade")
        expect(page.locator("#arr-stats")).to_contain_text("273")
        expect(page.get_by_text("answers are meaningless")).to_be_visible()  # the tiny model's banner
        expect(page.locator("#compare-stop")).to_be_visible()
        shots = [screenshot(page, "compare")]

        page.get_by_role("tab", name="Microscope").click()
        page.locator("#microscope-image input[type=file]").set_input_files(CAT)
        expect(page.locator("#microscope-image img")).to_be_visible(timeout=TIMEOUT_MS)
        page.locator("#microscope-question textarea").fill(QUESTION)
        page.get_by_role("button", name="Analyse").click()
        expect(page.get_by_text("273 saccades")).to_be_visible(timeout=TIMEOUT_MS)
        page.get_by_text("Faithfulness: does the answer depend").click()
        page.locator("#faithfulness-run").click()
        expect(page.locator("#faithfulness-summary")).to_contain_text("Answer scored", timeout=TIMEOUT_MS)
        assert page.locator("#faithfulness-plot img").evaluate("img => img.naturalWidth") > 0
        shots.append(screenshot(page, "microscope"))

        page.get_by_role("tab", name="Checkpoint A/B").click()
        page.locator("#ab-image input[type=file]").set_input_files(CAT)
        expect(page.locator("#ab-image img")).to_be_visible(timeout=TIMEOUT_MS)
        page.locator("#ab-question textarea").fill(QUESTION)
        page.get_by_role("button", name="Compare checkpoints").click()
        expect(page.get_by_text("saccade overlap")).to_be_visible(timeout=TIMEOUT_MS)
        expect(page.locator("#ab-stop")).to_be_visible()
        shots.append(screenshot(page, "ab"))
        browser.close()
    for shot in shots:
        assert 10_000 < shot.stat().st_size < MAX_SHOT_BYTES, shot
