"""The console in a real browser: Debian's chromium, headless, driven by Playwright,
against a real server (uvicorn, embedded stack, fake runtime). Each step is what an
operator or a tenant does by hand; screenshots of each page are taken (into
``CORRAL_TEST_SCREENSHOTS`` when set, e.g. ``docs/console``; else a temporary dir)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.console.render import XTERM_JS
from tests.app.api.v1.test_sandboxes import add_busybox
from tests.conftest import ADMIN_KEY
from tests.requirements import missing, require_tool

pytestmark = pytest.mark.browser

WIDE = {"width": 1280, "height": 900}
NARROW = {"width": 390, "height": 844}  # a phone


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("CORRAL_TEST_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium = require_tool("chromium", "scripts/setup-console.sh --browser")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def server_url(live_server: Callable[..., str], tmp_path: Path) -> str:
    """A real server (uvicorn, embedded stack, the fake runtime and sandbox backend)."""
    add_busybox(tmp_path / "data" / "images", "python")
    return live_server(sandbox_backends=["fake"])


@pytest.fixture
def wide(browser: Any, server_url: str) -> Iterator[Any]:
    """A page in a desktop-sized window, closed before the server stops (a live stream
    open would hold the server's shutdown)."""
    context = browser.new_context(viewport=WIDE)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def phone(browser: Any, server_url: str) -> Iterator[Any]:
    context = browser.new_context(viewport=NARROW)
    try:
        yield context.new_page()
    finally:
        context.close()


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(f"{url}/console")
    assert "/console/login" in page.url  # not signed in yet
    page.fill("input[name=api_key]", key)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/console")


def test_an_operator_and_a_tenant_at_work(wide: Any, server_url: str, shots: Path) -> None:
    url, page = server_url, wide
    sign_in(page, url, ADMIN_KEY)
    # the key is not kept anywhere the page's scripts can read
    assert page.evaluate("document.cookie") == ""
    assert ADMIN_KEY not in json.dumps(page.evaluate("Object.entries(localStorage)"))
    page.screenshot(path=shots / "overview.png", full_page=True)

    # the operator creates a tenant and changes a quota
    page.click("text=Tenants")
    page.fill("input[name=name]", "browser-team")
    page.click("text=Create")
    key = page.inner_text("#new-key").strip()
    assert re.fullmatch(r"crl_key_[0-9a-f]{20}_[A-Za-z0-9_-]{43}", key), key
    page.fill("input[name='quota.max_concurrent_executions']", "12")
    page.click("text=Save quotas")
    page.wait_for_selector("text=Saved.")
    assert page.input_value("input[name='quota.max_concurrent_executions']") == "12"
    page.screenshot(path=shots / "tenant.png", full_page=True)
    page.click("text=Sign out")
    page.wait_for_url(re.compile(r".*/console/login.*"))

    # the tenant runs code and finds it in its invocations
    sign_in(page, url, key)
    page.click("text=Run")
    page.select_option("select[name=language]", "fake")
    page.fill(
        "textarea[name=code]", json.dumps({"stdout": "hello from the browser", "cpu_ms": 1500})
    )
    page.click("button:has-text('Run')")
    page.wait_for_selector("#run-stdout")
    assert page.inner_text("#run-stdout") == "hello from the browser"
    assert page.inner_text("#status") == "succeeded"
    invocation_id = page.url.rsplit("/", 1)[1]
    page.screenshot(path=shots / "invocation.png", full_page=True)
    page.click("text=Invocations")
    assert invocation_id in page.inner_text("#invocations")
    page.click(f"text={invocation_id}")
    page.wait_for_url(f"{url}/console/invocations/{invocation_id}")

    # the cost chart is drawn from the usage API's figures
    api = httpx.get(
        f"{url}/v1/usage",
        params={"group_by": "day,kind", "start": "2000-01-01T00:00:00Z"},
        headers={"Authorization": f"Bearer {key}"},
    ).json()
    page.click("text=Usage")
    page.wait_for_selector("#cost-chart[data-drawn=true]")
    assert f"{api['rows'][0]['cost']:.6f}" in page.inner_text("#usage")
    drawn = page.evaluate("Chart.getChart('cost-chart').data.datasets[0].data")
    assert drawn == [round(api["rows"][0]["cost"], 6)]
    page.screenshot(path=shots / "usage.png", full_page=True)

    # the tenant opens a sandbox, runs a command in it, pauses, resumes and kills it
    page.click("text=Sandboxes")
    page.fill("input[name=backend]", "fake")
    page.click("button:has-text('Create')")
    page.wait_for_url(re.compile(r".*/console/sandboxes/sbx_.*"))
    assert page.inner_text("#state") == "running"
    page.fill("input[name=command]", "echo hello from a sandbox")
    page.click("form[action$='/exec'] button")
    page.wait_for_selector("#exec-stdout")
    assert page.inner_text("#exec-stdout") == "hello from a sandbox\n"
    page.screenshot(path=shots / "sandbox.png", full_page=True)
    page.click("button:has-text('Pause')")
    page.wait_for_selector("#state:has-text('paused')")
    page.click("button:has-text('Resume')")
    page.wait_for_selector("#state:has-text('running')")
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.click("button:has-text('Kill')")
    page.wait_for_selector("#state:has-text('stopped')")
    assert asked and asked[0].startswith("Kill the sandbox sbx_")


def test_the_operator_deletes_a_tenant_choosing_to_purge(
    wide: Any, server_url: str, shots: Path
) -> None:
    url, page = server_url, wide
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{url}/v1/tenants", json={"name": "leaving-team"}, headers=admin).json()
    tenant_id, key = made["tenant"]["id"], made["key"]["api_key"]
    headers = {"Authorization": f"Bearer {key}"}
    ran = httpx.post(f"{url}/v1/run", json={"language": "fake", "code": "{}"}, headers=headers)
    assert ran.status_code == 200, ran.text
    sign_in(page, url, ADMIN_KEY)
    page.goto(f"{url}/console/tenants/{tenant_id}")
    page.click("#delete-tenant")
    page.wait_for_url(f"{url}/console/tenants/{tenant_id}/delete")
    assert page.is_visible("text=Delete, keep its records")
    page.screenshot(path=shots / "tenant-delete.png", full_page=True)
    page.click("text=Delete and purge its data")
    page.wait_for_selector("#deleted")
    assert "Nothing of its data is left" in page.inner_text("#remaining")
    page.screenshot(path=shots / "tenant-deleted.png", full_page=True)
    assert httpx.get(f"{url}/v1/invocations", headers=headers).status_code == 401
    shown = httpx.get(f"{url}/v1/tenants/{tenant_id}", headers=admin).json()
    assert shown["deleted_at"] and shown["purged_at"]
    page.click("text=Back to the tenant")
    assert "Its data was purged" in page.inner_text("#state")


def test_the_overview_charts_the_last_hour_and_day(wide: Any, server_url: str, shots: Path) -> None:
    url, page = server_url, wide
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{url}/v1/tenants", json={"name": "busy-team"}, headers=admin).json()
    headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
    for program in ({}, {}, {"exit": 3}):
        body = {"language": "fake", "code": json.dumps(program)}
        assert httpx.post(f"{url}/v1/run", json=body, headers=headers).status_code == 200
    sign_in(page, url, ADMIN_KEY)
    for span in ("hour", "day"):
        page.goto(f"{url}/console?span={span}")
        page.wait_for_selector("#executions-chart[data-drawn=true]")
        page.wait_for_selector("#latency-chart[data-drawn=true]")
        drawn = page.evaluate(
            "Chart.getChart('executions-chart').data.datasets"
            ".map((d) => d.data.reduce((a, b) => a + b, 0))"
        )
        assert drawn == [2, 1, 0], (span, drawn)  # succeeded, failed (exit 3), errored
        p50 = page.evaluate("Chart.getChart('latency-chart').data.datasets[0].data")
        assert any(v is not None for v in p50)
    page.screenshot(path=shots / "overview-day.png", full_page=True)


def test_a_list_sorts_by_the_header_clicked(wide: Any, server_url: str) -> None:
    url, page = server_url, wide
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for name in ("zz-last", "aa-first"):
        made = httpx.post(f"{url}/v1/tenants", json={"name": name}, headers=admin).json()
        body = {"language": "fake", "code": "{}"}
        headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
        assert httpx.post(f"{url}/v1/run", json=body, headers=headers).status_code == 200
    sign_in(page, url, ADMIN_KEY)
    page.goto(f"{url}/console/invocations")
    tenants = "#invocations tbody td.name[title^=ten_]"
    assert page.locator(tenants).all_inner_texts() == ["aa-first", "zz-last"]  # newest first
    page.click("#invocations th a:has-text('tenant')")
    page.wait_for_url(re.compile(r".*sort=tenant.*"))
    assert page.locator(tenants).all_inner_texts() == ["aa-first", "zz-last"]
    assert "▲" in page.inner_text("#invocations thead")
    page.click("#invocations th a:has-text('tenant')")
    page.wait_for_url(re.compile(r".*sort=-tenant.*"))
    assert page.locator(tenants).all_inner_texts() == ["zz-last", "aa-first"]
    page.fill("input[name=tenant]", "zz-last")
    page.click("button:has-text('Filter')")
    page.wait_for_url(re.compile(r".*tenant=zz-last.*"))
    assert page.locator(tenants).all_inner_texts() == ["zz-last"]
    assert "sort=-tenant" in page.url  # the filter keeps the order


def test_a_tenant_uploads_a_file_into_a_sandbox_and_downloads_it(
    wide: Any, server_url: str, shots: Path, tmp_path: Path
) -> None:
    url, page = server_url, wide
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{url}/v1/tenants", json={"name": "files-team"}, headers=admin).json()
    key = made["key"]["api_key"]
    headers = {"Authorization": f"Bearer {key}"}
    body = {"image": "python", "backend": "fake"}
    created = httpx.post(f"{url}/v1/sandboxes", json=body, headers=headers)
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    data = os.urandom(3 * 1024 * 1024) + "é\n".encode()
    sign_in(page, url, key)
    page.goto(f"{url}/console/sandboxes/{sandbox_id}")
    page.set_input_files(
        "#upload input[type=file]",
        files=[{"name": "notes.bin", "mimeType": "application/octet-stream", "buffer": data}],
    )
    page.click("#upload button")
    page.wait_for_selector("#files a.download")
    assert "notes.bin" in page.inner_text("#files")
    with page.expect_download() as waiting:
        page.click("#files a.download")
    download = waiting.value
    assert download.suggested_filename == "notes.bin"
    saved = tmp_path / "notes.bin"
    download.save_as(saved)
    assert saved.read_bytes() == data
    stored = httpx.get(
        f"{url}/v1/sandboxes/{sandbox_id}/files",
        params={"path": "/home/user/notes.bin"},
        headers=headers,
    )
    assert stored.content == data
    # its CPU and memory, sampled while the page is open, drawn as they come
    page.wait_for_selector("#sandbox-chart[data-samples='2']", timeout=15_000)
    memory = page.evaluate("Chart.getChart('sandbox-chart').data.datasets[1].data")
    assert all(isinstance(v, int | float) and v > 0 for v in memory), memory
    page.screenshot(path=shots / "sandbox-files.png", full_page=True)


LONG = "a-team-with-a-very-long-name-" + "x" * 90  # 119 characters, within the 128 allowed
SIZES = {"1366": {"width": 1366, "height": 768}, "390": NARROW}


@pytest.mark.parametrize("size", sorted(SIZES))
def test_long_names_and_wide_tables_fit_the_screen(
    browser: Any, server_url: str, shots: Path, size: str
) -> None:
    """At 1366 px and on a phone no page scrolls sideways: a wide table scrolls in its
    card, a long name or id is cut with its whole in a tooltip."""
    url, viewport = server_url, SIZES[size]
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{url}/v1/tenants", json={"name": LONG}, headers=admin).json()
    tenant_id, key = made["tenant"]["id"], made["key"]["api_key"]
    headers = {"Authorization": f"Bearer {key}"}
    labels = {"experiment": "a-rather-long-label-value-" + "y" * 60, "episode": "17"}
    body = {"image": "python", "backend": "fake", "metadata": labels}
    created = httpx.post(f"{url}/v1/sandboxes", json=body, headers=headers)
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    ran = {"language": "fake", "code": json.dumps({"stdout": "w" * 300})}
    assert httpx.post(f"{url}/v1/run", json=ran, headers=headers).status_code == 200

    pages = {
        "overview": (ADMIN_KEY, "/console"),
        "sandboxes": (ADMIN_KEY, "/console/sandboxes"),
        "tenant": (ADMIN_KEY, f"/console/tenants/{tenant_id}"),
        "invocations": (ADMIN_KEY, "/console/invocations"),
        "sandbox": (key, f"/console/sandboxes/{sandbox_id}"),
    }
    for who in (ADMIN_KEY, key):
        context = browser.new_context(viewport=viewport)
        try:
            page = context.new_page()
            sign_in(page, url, who)
            for name, (whose, path) in pages.items():
                if whose != who:
                    continue
                page.goto(f"{url}{path}")
                width = page.evaluate("document.documentElement.scrollWidth")
                assert width <= viewport["width"], f"{name} scrolls sideways at {size} px"
                for cell in page.locator("td.name, td.id").all():
                    if cell.inner_text().strip():
                        assert cell.get_attribute("title"), f"{name}: a cut cell without its whole"
                page.screenshot(path=shots / f"{name}-{size}.png", full_page=True)
        finally:
            context.close()


def test_the_overview_updates_live_and_fits_a_phone(
    phone: Any, server_url: str, shots: Path
) -> None:
    page = phone
    sign_in(page, server_url, ADMIN_KEY)
    page.wait_for_selector("#live[data-updated]", timeout=10_000)  # a server-sent event arrived
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= NARROW["width"], "the page scrolls sideways on a phone"
    page.screenshot(path=shots / "overview-phone.png", full_page=True)


def test_a_running_invocation_and_a_sandbox_update_their_pages(
    wide: Any, server_url: str, shots: Path
) -> None:
    url, page = server_url, wide
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{url}/v1/tenants", json={"name": "live-team"}, headers=admin).json()
    key = made["key"]["api_key"]
    headers = {"Authorization": f"Bearer {key}"}
    sign_in(page, url, key)
    program = {"stdout": "done at last", "sleep": 4}
    body = {"language": "fake", "code": json.dumps(program)}
    with ThreadPoolExecutor(1) as caller:  # the call waits for its result meanwhile
        answer = caller.submit(httpx.post, f"{url}/v1/run", json=body, headers=headers, timeout=30)
        invocation_id = running_invocation(url, headers)
        page.goto(f"{url}/console/invocations/{invocation_id}")
        assert page.inner_text("#status") in ("queued", "running")
        assert page.is_visible("#watch")
        page.screenshot(path=shots / "invocation-running.png", full_page=True)
        # the page shows the result by itself once the invocation ends
        page.wait_for_selector("#run-stdout", timeout=20_000)
        assert page.inner_text("#run-stdout") == "done at last"
        assert page.inner_text("#status") == "succeeded"
        assert answer.result().json()["invocation_id"] == invocation_id

    # a sandbox's page follows it: killed from elsewhere, it shows so
    created = httpx.post(
        f"{url}/v1/sandboxes", json={"image": "python", "backend": "fake"}, headers=headers
    )
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    page.goto(f"{url}/console/sandboxes/{sandbox_id}")
    page.wait_for_selector("#sandbox-live[data-updated]", timeout=10_000)
    killed = httpx.delete(f"{url}/v1/sandboxes/{sandbox_id}", headers=headers)
    assert killed.status_code in (200, 204), killed.text
    page.wait_for_selector("#state:has-text('stopped')", timeout=10_000)


def running_invocation(url: str, headers: dict[str, str]) -> str:
    """The id of the tenant's one invocation, once it is recorded."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listed = httpx.get(f"{url}/v1/invocations", headers=headers).json()
        if listed["invocations"]:
            return str(listed["invocations"][0]["invocation_id"])
        time.sleep(0.05)
    raise AssertionError("the invocation was never recorded")


@pytest.mark.nsjail
def test_a_tenant_registers_and_invokes_a_function(
    browser: Any, live_server: Callable[..., str], shots: Path
) -> None:
    url = live_server(runtimes=["nsjail"], nsjail={"warm_per_language": 1})
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{url}/v1/tenants", json={"name": "fn-team"}, headers=admin).json()
    context = browser.new_context(viewport=WIDE)
    try:
        page = context.new_page()
        sign_in(page, url, made["key"]["api_key"])
        page.click("text=Functions")
        page.fill("input[name=name]", "word-stats")
        page.fill(
            "textarea[name=code]",
            "def handler(input):\n"
            "    words = input['text'].split()\n"
            "    return {'words': len(words), 'longest': max(words, key=len)}\n",
        )
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        page.fill("textarea[name=input_schema]", json.dumps({**schema, "required": ["text"]}))
        page.click("button:has-text('Register')")
        page.wait_for_url(f"{url}/console/functions/word-stats")
        page.fill("textarea[name=input]", json.dumps({"text": "a sandbox for agents at scale"}))
        page.click("button:has-text('Invoke')")
        page.wait_for_selector("#invoke-output", timeout=30_000)
        assert json.loads(page.inner_text("#invoke-output")) == {"words": 6, "longest": "sandbox"}
        assert page.inner_text("#invoke-result .status") == "succeeded"
        page.screenshot(path=shots / "function.png", full_page=True)
        page.click("text=Functions")
        assert "word-stats" in page.inner_text("#functions")
        page.screenshot(path=shots / "functions.png", full_page=True)
    finally:
        context.close()


@pytest.mark.nsjail
@pytest.mark.crun
@pytest.mark.slow
def test_a_tenant_runs_real_code_and_a_real_container_from_the_console(
    browser: Any, live_server: Callable[..., str], tmp_path: Path, shots: Path
) -> None:
    """The same steps as an operator's day above, on the runtimes ``make run`` serves:
    Python in a real jail, a real crun container of the ``python`` image."""
    from tests.app.api.v1.test_sandboxes_crun import python_images_dir
    from tests.node.sandboxes.conftest import leftovers
    from tests.requirements import require_nsjail

    require_nsjail()
    url = live_server(
        runtimes=["nsjail"],
        nsjail={"warm_per_language": 1},
        sandbox_backends=["crun"],
        images_dir=python_images_dir(),
    )
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{url}/v1/tenants", json={"name": "real-team"}, headers=admin).json()
    context = browser.new_context(viewport=WIDE)
    try:
        page = context.new_page()
        sign_in(page, url, made["key"]["api_key"])
        page.click("text=Run")
        page.select_option("select[name=language]", "python")
        page.fill("textarea[name=code]", "import sys\nprint(sum(range(10)), sys.version_info[0])")
        page.click("button:has-text('Run')")
        page.wait_for_selector("#run-stdout", timeout=30_000)
        assert page.inner_text("#run-stdout") == "45 3\n"
        assert page.inner_text("#status") == "succeeded"
        invocation_id = page.url.rsplit("/", 1)[1]
        page.click("text=Invocations")
        assert invocation_id in page.inner_text("#invocations")

        page.click("text=Sandboxes")
        assert page.input_value("input[name=backend]") == "crun"
        page.fill("input[name=memory_mb]", "256")
        page.click("button:has-text('Create')")
        page.wait_for_url(re.compile(r".*/console/sandboxes/sbx_.*"), timeout=30_000)
        sandbox_id = page.url.rsplit("/", 1)[1].split("?")[0]
        assert page.inner_text("#state") == "running"
        page.fill(
            "input[name=command]",
            "python3 -c \"import getpass; open('/home/user/made.txt', 'w').write('x' * 7); "
            'print(getpass.getuser())"',
        )
        page.click("form[action$='/exec'] button")
        page.wait_for_selector("#exec-stdout", timeout=30_000)
        assert page.inner_text("#exec-stdout") == "user\n"
        # the file the command wrote is in the sandbox's file browser
        page.fill("input[name=path]", "/home/user")
        page.click("button:has-text('Open')")
        row = page.locator("#files tr", has_text="made.txt")
        assert row.locator("td").nth(2).inner_text() == "7"
        page.screenshot(path=shots / "sandbox-crun.png", full_page=True)
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("button:has-text('Kill')")
        page.wait_for_selector("#state:has-text('stopped')", timeout=30_000)
    finally:
        context.close()
    assert leftovers(tmp_path / "data", sandbox_id) == []


@pytest.mark.crun
def test_a_tenant_types_into_a_sandboxs_terminal(
    browser: Any, live_server: Callable[..., str], tmp_path: Path, shots: Path
) -> None:
    """The sandbox page's terminal (xterm.js over the console's WebSocket) on a real crun
    sandbox: what is typed runs in the sandbox's shell, its answer shows."""
    if not XTERM_JS.exists():
        missing("xterm.js is not vendored (scripts/setup-console.sh)")
    images = tmp_path / "images"
    add_busybox(images)
    url = live_server(sandbox_backends=["crun"], images_dir=images)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{url}/v1/tenants", json={"name": "term-team"}, headers=admin).json()
    headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
    sandbox = httpx.post(
        f"{url}/v1/sandboxes", json={"image": "busybox", "backend": "crun"}, headers=headers
    )
    assert sandbox.status_code == 201, sandbox.text
    sandbox_id = sandbox.json()["id"]
    context = browser.new_context(viewport=WIDE)
    try:
        page = context.new_page()
        sign_in(page, url, made["key"]["api_key"])
        page.goto(f"{url}/console/sandboxes/{sandbox_id}")
        page.wait_for_selector("#terminal[data-connected]", timeout=20_000)
        page.click("#terminal")
        page.keyboard.type("echo $((6*7))")
        page.keyboard.press("Enter")
        page.wait_for_function(
            "document.querySelector('#terminal .xterm-rows').innerText.includes('\\n42')",
            timeout=20_000,
        )
        page.screenshot(path=shots / "sandbox-terminal.png", full_page=True)
        page.keyboard.type("exit 3")
        page.keyboard.press("Enter")
        page.wait_for_selector("#terminal[data-closed='1000']", timeout=20_000)
        assert page.inner_text("#terminal-status") == "closed: exit 3"
    finally:
        context.close()
        httpx.delete(f"{url}/v1/sandboxes/{sandbox_id}", headers=headers, timeout=60)
