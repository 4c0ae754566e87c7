"""The playground page in a real headless Chromium (Debian `chromium`, driven over the DevTools pipe): load `/`,
type a message, watch the reply stream in, check the live engine panel (and, on a speculating server, live tau
overall and per language), and screenshot the page."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.server.cdp import Browser, find_chromium
from tests.server.harness import MODEL_NAME, serve


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
    assert page.evaluate("document.getElementById('spec').hidden") is True  # this server does not speculate
    assert "speculation" not in meta
    shot = page.screenshot(tmp_path / "playground.png")
    _assert_not_blank(shot)


def test_playground_shows_live_acceptance_per_language(tiny_llama, browser, tmp_path):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    with serve(tiny_llama, speculative_config=spec) as srv:
        page = browser.page(1200, 800)
        page.navigate(srv.url + "/")
        page.wait_for(f"document.getElementById('model').textContent.startsWith('{MODEL_NAME}')")
        page.wait_for("!document.getElementById('spec').hidden")  # the panel appears once /stats says so
        page.evaluate("document.getElementById('p-temperature').value = '0';"
                      "document.getElementById('p-max_tokens').value = '48';"
                      "document.getElementById('p-language').value = 'de';")
        page.evaluate("document.getElementById('input').focus()")
        page.type_text("hello hello hello hello")
        page.press_enter()
        page.wait_for("(() => { const m = document.querySelector('.msg.assistant');"
                      " return m && m.dataset.done === '1'; })()")
        assert page.evaluate("document.querySelectorAll('.msg.error').length") == 0
        meta = page.evaluate("document.querySelector('.msg.assistant .meta').textContent")
        de = srv.engine.get_stats().spec_decode_by_language["de"]
        assert de.num_accepted_tokens > 0  # the reply repeats itself: drafts were accepted
        assert f"speculation: {de.num_accepted_tokens} of {de.num_draft_tokens} draft tokens accepted" in meta
        assert "de requests meanwhile" in meta
        # the live panel: overall tau and a row for "de", from the stats it polls
        tau = f"{de.mean_acceptance_length:.2f}"
        page.wait_for(f"(() => {{ const r = document.querySelector('#s-langs tr[data-language=\"de\"]');"
                      f" return r && r.children[1].textContent === '{tau}'; }})()")
        st = srv.engine.get_stats()
        assert page.evaluate("document.getElementById('s-tau').textContent") == \
            f"{st.spec_decode_mean_acceptance_length:.2f}"
        _assert_not_blank(page.screenshot(tmp_path / "playground-spec.png"))


def _assert_not_blank(path) -> None:
    from PIL import Image
    img = Image.open(path).convert("RGB")
    assert img.size == (1200, 800)
    colors = img.getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 20, "screenshot has almost no colours"
    background = max(colors)[0]
    assert background < 0.97 * img.size[0] * img.size[1], "screenshot is one flat colour"
