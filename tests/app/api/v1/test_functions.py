"""The function registry through the HTTP API: versions, aliases, artifacts, tenant
scoping and bad input. Nothing here runs a function (see ``test_functions_run.py``):
input is validated and versions resolved before anything is dispatched.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.functions.languages import MAX_CODE_BYTES

CODE = "def handler(input):\n    return {'n': input['x'] + 1}\n"
SCHEMA = {
    "type": "object",
    "properties": {
        "x": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["x"],
}


def _module(imports: list[tuple[str, str]], *, start: bool = True) -> bytes:
    """A tiny valid module with the given ``() -> ()`` function imports."""

    def name(s: str) -> bytes:
        raw = s.encode()
        return bytes([len(raw)]) + raw

    def section(sid: int, payload: bytes) -> bytes:
        return bytes([sid, len(payload)]) + payload

    types = section(1, b"\x01\x60\x00\x00")
    imp = b"".join(name(m) + name(n) + b"\x00\x00" for m, n in imports)
    body = [types]
    if imports:
        body.append(section(2, bytes([len(imports)]) + imp))
    body.append(section(3, b"\x01\x00"))
    if start:
        body.append(section(7, b"\x01" + name("_start") + b"\x00" + bytes([len(imports)])))
    body.append(section(10, b"\x01\x02\x00\x0b"))
    return b"\0asm\x01\x00\x00\x00" + b"".join(body)


def _register(client: TestClient, headers: dict[str, str], **fields: Any) -> Any:
    body = {"name": "inc", "language": "python", "code": CODE, "input_schema": SCHEMA} | fields
    return client.post("/v1/functions", json=body, headers=headers)


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    assert "Traceback" not in response.text
    return error


def test_register_get_list_and_versions(client: TestClient, new_tenant: Any) -> None:
    headers = new_tenant()["headers"]
    first = _register(client, headers)
    assert first.status_code == 201, first.text
    body = first.json()
    assert body["created"] is True
    assert body["version"]["version"] == 1
    assert body["version"]["content_hash"] == hashlib.sha256(CODE.encode()).hexdigest()
    assert body["version"]["limits"] == {"timeout_s": 10.0, "memory_mb": 512}
    assert body["function"]["aliases"] == {"latest": 1}

    # Identical content, entry point, schema and limits: the latest version comes back.
    again = _register(client, headers)
    assert again.status_code == 200
    assert again.json()["created"] is False
    assert again.json()["version"]["version"] == 1

    second = _register(client, headers, code=CODE + "# v2\n")
    assert second.status_code == 201
    assert second.json()["version"]["version"] == 2
    assert second.json()["function"]["aliases"] == {"latest": 2}

    got = client.get("/v1/functions/inc", headers=headers).json()
    assert got["latest"]["version"] == 2
    assert got["language"] == "python"
    listed = client.get("/v1/functions", headers=headers).json()["functions"]
    assert [f["name"] for f in listed] == ["inc"]
    versions = client.get("/v1/functions/inc/versions", headers=headers).json()["versions"]
    assert [v["version"] for v in versions] == [2, 1]


def test_aliases(client: TestClient, new_tenant: Any) -> None:
    headers = new_tenant()["headers"]
    _register(client, headers)
    _register(client, headers, code=CODE + "# v2\n")
    response = client.put("/v1/functions/inc/aliases/stable", json={"version": 1}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["aliases"] == {"latest": 2, "stable": 1}
    # latest moves with a new version; stable stays.
    third = _register(client, headers, code=CODE + "# v3\n")
    assert third.json()["function"]["aliases"] == {"latest": 3, "stable": 1}

    _error(
        client.put("/v1/functions/inc/aliases/latest", json={"version": 1}, headers=headers),
        422,
        "validation_error",
    )
    _error(
        client.put("/v1/functions/inc/aliases/stable", json={"version": 9}, headers=headers),
        404,
        "not_found",
    )
    _error(
        client.put("/v1/functions/inc/aliases/7up", json={"version": 1}, headers=headers),
        422,
        "validation_error",
    )
    deleted = client.delete("/v1/functions/inc/aliases/stable", headers=headers)
    assert deleted.json()["aliases"] == {"latest": 3}
    _error(client.delete("/v1/functions/inc/aliases/stable", headers=headers), 404, "not_found")


def test_soft_delete_and_revive(client: TestClient, new_tenant: Any) -> None:
    headers = new_tenant()["headers"]
    _register(client, headers)
    assert client.delete("/v1/functions/inc", headers=headers).status_code == 204
    _error(client.get("/v1/functions/inc", headers=headers), 404, "not_found")
    _error(
        client.post("/v1/functions/inc/invoke", json={"x": 1}, headers=headers), 404, "not_found"
    )
    assert client.get("/v1/functions", headers=headers).json()["functions"] == []
    _error(client.delete("/v1/functions/inc", headers=headers), 404, "not_found")
    # The name can be registered again: the history continues.
    revived = _register(client, headers)
    assert revived.status_code == 201
    assert revived.json()["version"]["version"] == 2
    assert revived.json()["function"]["aliases"] == {"latest": 2}


def test_another_tenants_function_is_not_found(client: TestClient, new_tenant: Any) -> None:
    owner, other = new_tenant()["headers"], new_tenant()["headers"]
    _register(client, owner)
    for method, path, body in [
        ("GET", "/v1/functions/inc", None),
        ("GET", "/v1/functions/inc/versions", None),
        ("DELETE", "/v1/functions/inc", None),
        ("POST", "/v1/functions/inc/invoke", {"x": 1}),
        ("POST", "/v1/functions/inc/versions/1/invoke", {"x": 1}),
        ("POST", "/v1/functions/inc/invoke/batch", {"inputs": [{"x": 1}]}),
        ("PUT", "/v1/functions/inc/aliases/stable", {"version": 1}),
    ]:
        _error(client.request(method, path, json=body, headers=other), 404, "not_found")
    assert client.get("/v1/functions", headers=other).json()["functions"] == []
    # The same name in another tenant is another function.
    mine = _register(client, other, code=CODE + "# other\n")
    assert mine.json()["version"]["version"] == 1
    assert client.get("/v1/functions/inc", headers=owner).json()["latest"]["version"] == 1


def test_unknown_function_or_version_is_404(client: TestClient, new_tenant: Any) -> None:
    headers = new_tenant()["headers"]
    _error(client.post("/v1/functions/nope/invoke", json={}, headers=headers), 404, "not_found")
    _register(client, headers)
    _error(
        client.post("/v1/functions/inc/versions/7/invoke", json={"x": 1}, headers=headers),
        404,
        "not_found",
    )
    _error(
        client.post("/v1/functions/inc/invoke?version=stable", json={"x": 1}, headers=headers),
        404,
        "not_found",
    )
    _error(client.get("/v1/functions/inc/invocations/inv_nope", headers=headers), 404, "not_found")


@pytest.fixture
def stack() -> dict[str, Any]:
    """Bad input does not depend on the deployment shape: embedded only."""
    return {}


class TestBadInput:
    def test_input_violating_the_schema_is_422_naming_the_field(
        self, client: TestClient, new_tenant: Any
    ) -> None:
        headers = new_tenant()["headers"]
        _register(client, headers)
        error = _error(
            client.post("/v1/functions/inc/invoke", json={"x": "one"}, headers=headers),
            422,
            "input_validation_error",
        )
        assert "$.x" in error["message"]
        assert error["details"][0]["path"] == ["x"]
        error = _error(
            client.post(
                "/v1/functions/inc/invoke", json={"x": 1, "tags": ["a", 2]}, headers=headers
            ),
            422,
            "input_validation_error",
        )
        assert "$.tags[1]" in error["message"]
        error = _error(
            client.post("/v1/functions/inc/invoke", json={}, headers=headers),
            422,
            "input_validation_error",
        )
        assert "'x' is a required property" in error["message"]

    def test_batch_reports_bad_items_on_their_own(
        self, client: TestClient, new_tenant: Any
    ) -> None:
        headers = new_tenant()["headers"]
        _register(client, headers)
        response = client.post(
            "/v1/functions/inc/invoke/batch", json={"inputs": [{"x": "a"}]}, headers=headers
        )
        assert response.status_code == 200, response.text
        item = response.json()["results"][0]
        assert item["error"]["code"] == "input_validation_error"
        assert item["result"] is None

    def test_invalid_schema(self, client: TestClient, new_tenant: Any) -> None:
        headers = new_tenant()["headers"]
        error = _error(
            _register(client, headers, input_schema={"type": "integr"}),
            422,
            "invalid_input_schema",
        )
        assert "type" in error["message"]

    def test_unsupported_language(self, client: TestClient, new_tenant: Any) -> None:
        headers = new_tenant()["headers"]
        error = _error(_register(client, headers, language="cobol"), 422, "validation_error")
        assert "wasm-python" in error["message"]

    def test_python_syntax_error_and_missing_entry_point(
        self, client: TestClient, new_tenant: Any
    ) -> None:
        headers = new_tenant()["headers"]
        error = _error(_register(client, headers, code="def handler(:\n"), 422, "invalid_artifact")
        assert "line 1" in error["message"]
        error = _error(
            _register(client, headers, code="def main(x):\n    return x\n"), 422, "invalid_artifact"
        )
        assert "handler" in error["message"]
        ok = _register(client, headers, code="def main(x):\n    return x\n", entry_point="main")
        assert ok.status_code == 201, ok.text
        _error(_register(client, headers, entry_point="not valid"), 422, "validation_error")

    def test_code_and_module_exactly_one(self, client: TestClient, new_tenant: Any) -> None:
        headers = new_tenant()["headers"]
        _error(_register(client, headers, code=None), 422, "validation_error")
        _error(
            _register(client, headers, module_base64=base64.b64encode(b"x").decode()),
            422,
            "validation_error",
        )
        _error(
            _register(client, headers, language="wasm", code=None, module_base64="@@@"),
            422,
            "validation_error",
        )

    def test_garbage_wasm_is_refused_at_registration(
        self, client: TestClient, new_tenant: Any
    ) -> None:
        headers = new_tenant()["headers"]
        for garbage, words in [
            (b"garbage bytes, not wasm", "not a WebAssembly binary"),
            (b"\0asm\x01\x00\x00\x00\xff\xff", "not valid WebAssembly"),
            (b"\0asm\x0d\x00\x01\x00", "components are not supported"),
        ]:
            error = _error(
                _register(
                    client,
                    headers,
                    language="wasm",
                    code=None,
                    module_base64=base64.b64encode(garbage).decode(),
                ),
                422,
                "invalid_artifact",
            )
            assert words in error["message"]

    def test_module_importing_host_functions_not_offered(
        self, client: TestClient, new_tenant: Any
    ) -> None:
        headers = new_tenant()["headers"]
        module = _module([("wasi_snapshot_preview1", "sched_yield"), ("env", "launch_missiles")])
        error = _error(
            _register(
                client,
                headers,
                name="m",
                language="wasm",
                code=None,
                module_base64=base64.b64encode(module).decode(),
            ),
            422,
            "invalid_artifact",
        )
        assert "env.launch_missiles" in error["message"]
        assert error["details"]["unsupported_imports"] == ["env.launch_missiles"]
        no_start = _module([], start=False)
        error = _error(
            _register(
                client,
                headers,
                name="m",
                language="wasm",
                code=None,
                module_base64=base64.b64encode(no_start).decode(),
            ),
            422,
            "invalid_artifact",
        )
        assert "_start" in error["message"]
        good = _module([("wasi_snapshot_preview1", "sched_yield")])
        ok = _register(
            client,
            headers,
            name="m",
            language="wasm",
            code=None,
            module_base64=base64.b64encode(good).decode(),
        )
        assert ok.status_code == 201, ok.text
        assert ok.json()["version"]["entry_point"] == "_start"

    def test_oversized_uploads_are_413(self, client: TestClient, new_tenant: Any) -> None:
        headers = new_tenant()["headers"]
        big = "#" * (MAX_CODE_BYTES + 1)
        _error(_register(client, headers, code=big), 413, "payload_too_large")
        manifest = '{"language": "python"}'
        files = {"artifact": ("f.py", big.encode(), "text/x-python")}
        _error(
            client.post(
                "/v1/functions/big/versions",
                data={"manifest": manifest},
                files=files,
                headers=headers,
            ),
            413,
            "payload_too_large",
        )
        # Past the gateway's body limit (8 MiB): refused before it is read.
        huge = {"artifact": ("f.wasm", b"\0" * (9 * 1024 * 1024), "application/wasm")}
        _error(
            client.post(
                "/v1/functions/big/versions",
                data={"manifest": '{"language": "wasm"}'},
                files=huge,
                headers=headers,
            ),
            413,
            "payload_too_large",
        )

    def test_limits_over_the_quota(self, client: TestClient, new_tenant: Any) -> None:
        headers = new_tenant(max_memory_mb=256, max_wall_seconds=5)["headers"]
        _error(_register(client, headers, limits={"memory_mb": 512}), 422, "limit_too_high")
        _error(_register(client, headers, limits={"timeout_s": 6}), 422, "limit_too_high")
        ok = _register(client, headers, limits={"timeout_s": 5})
        assert ok.json()["version"]["limits"] == {"timeout_s": 5.0, "memory_mb": 256}

    def test_bad_names_and_bodies(self, client: TestClient, new_tenant: Any) -> None:
        headers = new_tenant()["headers"]
        _error(_register(client, headers, name="../etc"), 422, "validation_error")
        _error(_register(client, headers, surprise=1), 422, "validation_error")
        _register(client, headers)
        _error(
            client.post(
                "/v1/functions/inc/invoke",
                content=b"{",
                headers=headers | {"Content-Type": "application/json"},
            ),
            400,
            "invalid_json",
        )
        _error(
            client.post("/v1/functions/inc/invoke/batch", json={"inputs": []}, headers=headers),
            422,
            "validation_error",
        )
        _error(
            client.post("/v1/functions/x/versions", json={"language": "python"}, headers=headers),
            415,
            "unsupported_media_type",
        )
        _error(
            client.post(
                "/v1/functions/x/versions",
                data={"manifest": "{"},
                files={"artifact": ("f.py", CODE.encode(), "text/plain")},
                headers=headers,
            ),
            422,
            "validation_error",
        )
        _error(
            client.post(
                "/v1/functions/x/versions", data={"manifest": "{}"}, files={}, headers=headers
            ),
            415,
            "unsupported_media_type",
        )

    def test_multipart_upload(self, client: TestClient, new_tenant: Any) -> None:
        headers = new_tenant()["headers"]
        response = client.post(
            "/v1/functions/up/versions",
            data={"manifest": '{"language": "python", "entry_point": "handler"}'},
            files={"artifact": ("f.py", CODE.encode(), "text/x-python")},
            headers=headers,
        )
        assert response.status_code == 201, response.text
        assert response.json()["function"]["name"] == "up"
        assert (
            response.json()["version"]["content_hash"] == hashlib.sha256(CODE.encode()).hexdigest()
        )

    def test_needs_a_key(self, client: TestClient) -> None:
        _error(client.get("/v1/functions"), 401, "missing_api_key")
        _error(client.post("/v1/functions/x/invoke", json={}), 401, "missing_api_key")
