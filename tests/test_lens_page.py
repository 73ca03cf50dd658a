"""gptblock.lens.page: the attention viewer, self-contained, and working in a real browser.

The browser test drives Debian's headless Chromium through Selenium and Debian's chromedriver
(``apt-get install chromium chromium-driver``; ``.ci/run`` installs them). Nothing downloads a
browser. Where they are missing it skips, saying why, unless GPTBLOCK_REQUIRE_BROWSER is set
(as ``.ci/run`` sets it), in which case it fails: CI must not pass by skipping it.
"""

import io
import json
import os
import re
import shutil

import numpy as np
import pytest
from matplotlib.image import imread

from gptblock import CharTokenizer
from gptblock.lens import attention_page, inspect_prompt, save_attention_page
from gptblock.lens.page import page_data
from lens_models import lens_gpt

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TEXT = "abcdefghiprst <>/&'\"\n"
TOKENIZER = CharTokenizer.from_text(TEXT)
PROMPT = "a <b>c</script>&d\nef' g"  # markup and a script end tag, as prompt characters


@pytest.fixture(scope="module")
def seen():
    model = lens_gpt(vocab_size=TOKENIZER.vocab_size, block_size=32, n_layer=2, n_head=3, n_embd=24)
    return inspect_prompt(model, TOKENIZER, PROMPT)


def embedded(page):
    """The JSON the page carries, parsed as the browser's JSON.parse would."""
    found = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_the_page_is_self_contained(seen):
    page = attention_page(seen)
    assert not re.search(r"https?:|//[a-z]|\bsrc=|\bhref=|<link|@import|url\(", page)
    assert "default-src 'none'" in page  # and the browser is told to fetch nothing
    assert page.count("</script>") == 2  # the prompt's "</script>" cannot end the data early
    assert embedded(page) == json.loads(json.dumps(page_data(seen)))
    assert embedded(page)["prompt"] == PROMPT


def test_the_page_holds_the_cached_patterns_to_3_decimals(seen):
    data = page_data(seen)
    assert (data["layers"], data["heads"]) == (2, 3)
    for layer in range(2):
        pattern = seen.run.cache[f"blocks.{layer}.pattern"][0].numpy()  # (nh, T, T)
        for head in range(3):
            for t, row in enumerate(data["pattern"][layer][head]):
                assert len(row) == t + 1  # the causal part only
                np.testing.assert_allclose(
                    np.array(row) / 1000, pattern[head, t, : t + 1], atol=5e-4
                )


def test_a_page_for_the_whole_context_is_a_reasonable_size():
    text = "abcdefgh " * 8  # 72 characters; the context is 64
    model = lens_gpt(vocab_size=9, block_size=64, n_layer=4, n_head=4, n_embd=32)
    seen = inspect_prompt(model, CharTokenizer.from_text(text), text[:64])
    size = len(attention_page(seen).encode())
    assert size < 250_000, size  # the tiny preset's shape: 4 x 4 heads of 64 x 64


# --- in a real browser ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package")
    if missing:
        why = f"needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("GPTBLOCK_REQUIRE_BROWSER"):
            pytest.fail(f"GPTBLOCK_REQUIRE_BROWSER is set, but the browser test {why}")
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1200,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_the_page_in_headless_chromium(seen, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    path = tmp_path / "attention.html"
    save_attention_page(seen, path)
    browser.get(path.as_uri())
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"
    assert browser.find_element(By.ID, "title").get_attribute("textContent") == PROMPT
    cells = browser.find_elements(By.CSS_SELECTOR, "#prompt .tok")
    assert len(cells) == len(PROMPT)

    def shown():
        return [c.find_element(By.CLASS_NAME, "w").text for c in cells]

    for layer, head, t in [(1, 2, 9), (0, 1, 17), (1, 0, 0)]:
        Select(browser.find_element(By.ID, "layer")).select_by_value(str(layer))
        Select(browser.find_element(By.ID, "head")).select_by_value(str(head))
        ActionChains(browser).move_to_element(cells[t]).perform()
        expected = seen.run.cache[f"blocks.{layer}.pattern"][0, head, t].numpy()  # (T,)
        weights = shown()
        assert all(w == "" for w in weights[t + 1 :])  # the future is not attended to
        np.testing.assert_allclose(
            [float(w) for w in weights[: t + 1]], expected[: t + 1], atol=5e-4 + 1e-9
        )
        assert "query" in cells[t].get_attribute("class")

    # A click keeps the selection while the pointer moves on; a second click releases it.
    cells[5].click()
    ActionChains(browser).move_to_element(cells[12]).perform()
    assert "query" in cells[5].get_attribute("class")
    cells[5].click()
    ActionChains(browser).move_to_element(cells[12]).perform()
    assert "query" in cells[12].get_attribute("class")

    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    problems = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert problems == []

    png = browser.get_screenshot_as_png()
    pixels = imread(io.BytesIO(png))[..., :3]  # (H, W, 3) in [0, 1]
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert pixels.std() > 0.05 and len(colours) > 50  # not blank: text, tints, the heatmap
    (tmp_path / "screenshot.png").write_bytes(png)
