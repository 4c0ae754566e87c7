"""The playground page in a real headless Chromium (Debian `chromium`, driven over the DevTools pipe): load `/`,
type a message, watch the reply stream in, check the live engine panel, and screenshot the page."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.server.cdp import Browser, find_chromium
from tests.server.harness import MODEL_NAME


@pytest.fixture(scope="module")
def browser():
    exe = find_chromium()
    if exe is None:
        if os.environ.get("CINQ_SKIP_BROWSER_TESTS") == "1":
            pytest.skip("CINQ_SKIP_BROWSER_TESTS=1 and no chromium")
        pytest.fail("chromium is not installed: run scripts/setup.sh --test (apt-get install chromium)")
    b = Browser(exe)
    yield b
    b.close()


def test_playground_streams_a_reply(server, browser, tmp_path):
    page = browser.page(1200, 800)
    page.navigate(server.url + "/")
    page.wait_for(f"document.getElementById('model').textContent.startsWith('{MODEL_NAME}')")
    # Greedy so the page's reply can be compared with the API's; enough tokens to arrive in several chunks.
    page.evaluate("document.getElementById('p-temperature').value = '0';"
                  "document.getElementById('p-max_tokens').value = '48';")
    page.evaluate("document.getElementById('input').focus()")
    page.type_text("Hello, playground!")
    page.press_enter()
    page.wait_for("(() => { const m = document.querySelector('.msg.assistant');"
                  " return m && m.dataset.done === '1'; })()")
    reply, chunks, meta = page.evaluate(
        "(() => { const m = document.querySelector('.msg.assistant');"
        " return [m.querySelector('.body').textContent, Number(m.dataset.chunks),"
        " m.querySelector('.meta').textContent]; })()")
    assert page.evaluate("document.querySelectorAll('.msg.error').length") == 0
    assert page.evaluate("document.querySelector('.msg.user').textContent") == "Hello, playground!"
    api = httpx.post(server.api + "/chat/completions", timeout=30, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello, playground!"}],
        "temperature": 0, "max_tokens": 48, "top_p": 0.95}).json()
    assert reply == api["choices"][0]["message"]["content"] and reply
    assert chunks > 1  # the text arrived piece by piece, not at once
    assert f"{api['usage']['completion_tokens']} generated tokens" in meta
    # The live engine panel polls /stats.
    page.wait_for(f"document.getElementById('s-blocks').textContent === '{server.engine.num_blocks}'")
    assert page.evaluate("document.getElementById('health').className") == "dot ok"
    shot = page.screenshot(tmp_path / "playground.png")
    _assert_not_blank(shot)


def _assert_not_blank(path) -> None:
    from PIL import Image
    img = Image.open(path).convert("RGB")
    assert img.size == (1200, 800)
    colors = img.getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 20, "screenshot has almost no colours"
    background = max(colors)[0]
    assert background < 0.97 * img.size[0] * img.size[1], "screenshot is one flat colour"
