"""
The Compare tab in a real browser: headless Chromium, driven by Playwright, against `python app.py --model tiny`.
Uploads an example image, asks a question, clicks Compare, waits for both streamed answers, checks the
heatmap and both stats tables are shown, and saves a screenshot (also to out/screenshot_compare.png).

    apt-get install -y chromium   # skipped without /usr/bin/chromium
    .venv/bin/python -m pytest tests/test_browser.py -q
"""

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAT = str(ROOT / "assets" / "chelsea.png")
QUESTION = "What colour are the cat's eyes?"

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 120_000

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not CHROMIUM.exists(), reason=f"needs {CHROMIUM} (apt-get install chromium)")]


def test_compare_in_the_browser(app_url, tmp_path):
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

        screenshot = tmp_path / "screenshot_compare.png"
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
    (ROOT / "out").mkdir(exist_ok=True)
    shutil.copy(screenshot, ROOT / "out" / "screenshot_compare.png")
    assert screenshot.stat().st_size > 10_000
