"""A tenant builds its own image through the API (``POST /v1/images``) on real containers
(crun) from the ``python`` image: the build runs in a sandbox of the tenant's (RUN as
that sandbox's root, a mapped id of the host), its log streams, the image's files are a
snapshot counted in the tenant's storage, and nobody else sees or uses it."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

import corral
from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.conftest import ADMIN

pytestmark = [pytest.mark.crun, pytest.mark.slow]

DOCKERFILE = """\
FROM python
ARG WHO=tenant
ENV GREETING="hello from $WHO" APP=/opt/app
COPY app.py $APP/
COPY --chown=user data/ /home/user/data/
USER root
RUN echo "building as $(id -u)" && cat /proc/self/uid_map > $APP/uid_map \\
    && python3 $APP/app.py > $APP/ran.txt && echo "stderr line" >&2
USER user
WORKDIR /home/user/work
EXPOSE 8080
CMD ["python3", "/opt/app/app.py"]
"""


def context_archive(files: dict[str, str], *, gzip: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


CONTEXT = {"app.py": "print('app ran')\n", "data/notes.txt": "notes\n"}


def tenant(url: str, name: str, **quota: Any) -> dict[str, str]:
    body: dict[str, Any] = {"name": name, "quota": quota} if quota else {"name": name}
    made = httpx.post(f"{url}/v1/tenants", json=body, headers=ADMIN).json()
    return {"Authorization": f"Bearer {made['key']['api_key']}"}


@contextmanager
def building(
    api: httpx.Client, name: str, dockerfile: str, context: bytes | None = None, **fields: str
) -> Iterator[httpx.Response]:
    files: dict[str, Any] = {"dockerfile": ("Dockerfile", dockerfile.encode())}
    if context is not None:
        files["context"] = ("context.tar.gz", context, "application/gzip")
    with api.stream("POST", "/v1/images", data={"name": name, **fields}, files=files) as answer:
        yield answer


def build(api: httpx.Client, name: str, dockerfile: str, context: bytes | None = None) -> list:
    """The build's log, one object per line."""
    with building(api, name, dockerfile, context) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"] == "application/x-ndjson"
        return [json.loads(line) for line in answer.iter_lines()]


def live_sandboxes(api: httpx.Client) -> list[dict[str, Any]]:
    sandboxes: list[dict[str, Any]] = api.get("/v1/sandboxes").json()["sandboxes"]
    return sandboxes


def none_left(api: httpx.Client) -> list[dict[str, Any]]:
    """The tenant's live sandboxes once none is left (or after 60 s)."""
    deadline = time.monotonic() + 60
    while (left := live_sandboxes(api)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def deleted_soon(api: httpx.Client, path: str) -> httpx.Response:
    """``DELETE path`` once no sandbox is built on it any more (a destroyed sandbox is
    torn down off the destroy's path), or its 409 after 30 s."""
    deadline = time.monotonic() + 30
    while (answer := api.delete(path)).status_code == 409 and time.monotonic() < deadline:
        time.sleep(0.2)
    return answer


@pytest.fixture
def url(live_server: Callable[..., str]) -> str:
    return live_server(sandbox_backends=["crun"], images_dir=python_images_dir())


def test_a_tenant_builds_an_image_and_makes_sandboxes_of_it(url: str) -> None:
    with httpx.Client(base_url=url, headers=tenant(url, "builder"), timeout=120) as api:
        lines = build(api, "my-app", DOCKERFILE, context_archive(CONTEXT))
        steps = [line["step"] for line in lines if "step" in line]
        assert any(s.startswith("line 7: RUN echo") for s in steps), lines
        logs = [(line["stream"], line["log"]) for line in lines if "log" in line]
        assert ("stdout", "building as 0\n") in logs, logs  # RUN as the sandbox's root
        assert ("stderr", "stderr line\n") in logs, logs
        assert list(lines[-1]) == ["image"], lines[-1]
        image = lines[-1]["image"]
        assert (image["name"], image["scope"], image["parent"]) == ("my-app", "tenant", "python")
        assert (image["user"], image["workdir"]) == ("user", "/home/user/work")
        assert image["env"]["GREETING"] == "hello from tenant" and "PATH" in image["env"]
        assert image["cmd"] == ["python3", "/opt/app/app.py"] and image["size_bytes"] > 0
        assert none_left(api) == []  # the build's sandbox ended

        listed = {i["name"]: i for i in api.get("/v1/images").json()["images"]}
        assert listed["my-app"]["scope"] == "tenant" and listed["python"]["scope"] == "catalogue"
        assert api.get("/v1/images/my-app").json()["size_bytes"] == image["size_bytes"]
        # its files are a snapshot of the tenant's: its size is in the tenant's storage
        (snapshot,) = api.get("/v1/snapshots").json()["snapshots"]
        assert snapshot["size_bytes"] == image["size_bytes"]
        held = api.delete(f"/v1/snapshots/{snapshot['id']}")  # deleted only with its image
        assert held.status_code == 409 and "my-app" in held.json()["error"]["message"]

        created = api.post("/v1/sandboxes", json={"image": "my-app", "memory_mb": 256})
        assert created.status_code == 201, created.text
        sbx = created.json()
        assert sbx["image"] == "my-app"
        script = (
            "cat $APP/ran.txt $APP/uid_map /home/user/data/notes.txt; echo $GREETING; whoami; "
            "stat -c %U /home/user/data/notes.txt; test -e /.corral-build || echo clean; pwd"
        )
        ran = api.post(f"/v1/sandboxes/{sbx['id']}/exec", json={"command": script}).json()
        out = ran["stdout"].splitlines()
        assert out[0] == "app ran", ran
        inside, host, count = out[1].split()  # the build's root: a mapped id of the host
        assert (inside, count) == ("0", "65536") and int(host) > 0, out[1]
        assert out[2:] == ["notes", "hello from tenant", "user", "user", "clean", "/home/user/work"]
        forked = api.post(f"/v1/sandboxes/{sbx['id']}/fork", json={"count": 1}).json()
        (fork,) = forked["sandboxes"]
        echo = {"command": "echo $GREETING; pwd; cat $APP/ran.txt"}
        again = api.post(f"/v1/sandboxes/{fork['id']}/exec", json=echo).json()
        assert again["stdout"] == "hello from tenant\n/home/user/work\napp ran\n", again
        api.delete(f"/v1/sandboxes/{fork['id']}")
        in_use = api.delete("/v1/images/my-app")
        assert in_use.status_code == 409, in_use.text  # a sandbox is made of it
        api.delete(f"/v1/sandboxes/{sbx['id']}")

        # E2B's SDK names it as a template
        key = api.headers["authorization"].removeprefix("Bearer ")
        e2b = httpx.post(
            f"{url}/sandboxes",
            json={"templateID": "my-app", "timeout": 60},
            headers={"X-API-Key": key},
            timeout=60,
        )
        assert e2b.status_code == 201, e2b.text
        e2b_id = e2b.json()["sandboxID"]
        env = api.post(f"/v1/sandboxes/{e2b_id}/exec", json={"command": "echo $GREETING"})
        assert env.json()["stdout"] == "hello from tenant\n", env.text
        api.delete(f"/v1/sandboxes/{e2b_id}")
        assert none_left(api) == []
        on_it = api.delete("/v1/images/my-app")
        assert on_it.status_code == 409, on_it.text  # the fork's snapshot is built on it
        assert deleted_soon(api, f"/v1/snapshots/{forked['snapshot']['id']}").status_code == 204
        gone = deleted_soon(api, "/v1/images/my-app")
        assert gone.status_code == 204, gone.text
        assert api.get("/v1/images/my-app").status_code == 404
        assert api.get("/v1/snapshots").json()["snapshots"] == []  # the image's went with it


def test_a_failing_run_gives_its_error_line_and_no_image(url: str) -> None:
    dockerfile = "FROM python\nRUN echo about to fail && exit 3\nENV NEVER=1\n"
    with httpx.Client(base_url=url, headers=tenant(url, "failing"), timeout=120) as api:
        lines = build(api, "broken", dockerfile)
        assert {"log": "about to fail\n", "stream": "stdout"} in lines
        error = lines[-1]["error"]
        assert error["code"] == "build_failed"
        assert error["message"].startswith("Dockerfile line 2: RUN failed (exit 3)"), error
        assert "about to fail" in error["message"]
        assert not any("line 3" in line.get("step", "") for line in lines)
        assert api.get("/v1/images/broken").status_code == 404
        assert api.get("/v1/snapshots").json()["snapshots"] == []
        assert none_left(api) == []

        missing = build(api, "nothing", "FROM python\nCOPY absent.txt /tmp/\n")
        assert missing[-1]["error"]["code"] == "build_failed"
        assert missing[-1]["error"]["message"] == (
            "Dockerfile line 2: COPY: COPY source 'absent.txt' matches nothing in the build context"
        )


def test_the_storage_quota_counts_the_images(url: str) -> None:
    """Each image's snapshot is counted against max_storage_mb: the first fits, the
    second would pass it and is refused with the storage error's code; once the storage
    is full (the quota lowered under what the first holds) a build cannot start."""
    dockerfile = "FROM python\nUSER root\nRUN head -c 3000000 /dev/urandom > /blob\n"
    made = httpx.post(
        f"{url}/v1/tenants", json={"name": "storing", "quota": {"max_storage_mb": 4}}, headers=ADMIN
    ).json()
    headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as api:
        first = build(api, "one", dockerfile)
        assert first[-1]["image"]["size_bytes"] >= 3_000_000, first[-1]
        second = build(api, "two", dockerfile)
        assert second[-1]["error"]["code"] == "storage_quota_exhausted", second[-1]
        assert api.get("/v1/images/two").status_code == 404
        assert len(api.get("/v1/snapshots").json()["snapshots"]) == 1
        assert none_left(api) == []
        lowered = httpx.patch(
            f"{url}/v1/tenants/{made['tenant']['id']}",
            json={"quota": {"max_storage_mb": 2}},
            headers=ADMIN,
        )
        assert lowered.status_code == 200, lowered.text
        with building(api, "three", "FROM python\n") as third:
            refused = json.loads(third.read())
        assert third.status_code == 429, refused
        assert refused["error"]["code"] == "storage_quota_exhausted"
        assert live_sandboxes(api) == []  # refused before any sandbox was made


def test_another_tenant_cannot_see_use_or_delete_the_image(url: str) -> None:
    owner = tenant(url, "owner")
    other = tenant(url, "other")
    with httpx.Client(base_url=url, headers=owner, timeout=120) as api:
        lines = build(api, "private", "FROM python\nENV SECRET=mine\n")
        assert "image" in lines[-1], lines[-1]
    with httpx.Client(base_url=url, headers=other, timeout=120) as api:
        assert "private" not in [i["name"] for i in api.get("/v1/images").json()["images"]]
        assert api.get("/v1/images/private").status_code == 404
        use = api.post("/v1/sandboxes", json={"image": "private", "memory_mb": 256})
        assert use.status_code == 404, use.text
        assert api.delete("/v1/images/private").status_code == 404
        with building(api, "mine", "FROM private\n") as answer:
            refused = json.loads(answer.read())
        assert answer.status_code == 422 and refused["error"]["code"] == "invalid_dockerfile"
        assert "no image 'private'" in refused["error"]["message"]
        # its own image of the same name is its own
        assert "image" in build(api, "private", "FROM python\nENV SECRET=theirs\n")[-1]
        assert api.get("/v1/images/private").json()["env"]["SECRET"] == "theirs"
    with httpx.Client(base_url=url, headers=owner, timeout=120) as api:
        assert api.get("/v1/images/private").json()["env"]["SECRET"] == "mine"
        # FROM one of its own: the tenant's images stack
        stacked = build(api, "stacked", "FROM private\nRUN echo $SECRET > /home/user/s\n")
        assert stacked[-1]["image"]["parent"] == "private", stacked[-1]
        made = api.post("/v1/sandboxes", json={"image": "stacked", "memory_mb": 256}).json()
        ran = api.post(f"/v1/sandboxes/{made['id']}/exec", json={"cmd": ["cat", "s"]}).json()
        assert ran["stdout"] == "mine\n", ran
        api.delete(f"/v1/sandboxes/{made['id']}")


def test_a_client_that_goes_cancels_the_build_and_ends_its_sandbox(url: str) -> None:
    dockerfile = "FROM python\nRUN echo started && sleep 600\n"
    with httpx.Client(base_url=url, headers=tenant(url, "leaving"), timeout=120) as api:
        with building(api, "slow", dockerfile) as answer:
            lines = answer.iter_lines()  # held: a generator dropped would close the answer
            for line in lines:
                if json.loads(line).get("log") == "started\n":
                    break
            (running,) = live_sandboxes(api)
            assert running["metadata"] == {"corral.build": "slow"}
        # the connection is closed here, mid-RUN
        assert none_left(api) == []
        assert api.get("/v1/images/slow").status_code == 404


def test_the_sdk_builds_with_a_directory_as_context(url: str, tmp_path: Any) -> None:
    key = tenant(url, "sdk")["Authorization"].removeprefix("Bearer ")
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "hello.txt").write_text("hi\n")
    seen: list[dict[str, Any]] = []
    with corral.Corral(url, key) as sdk:
        image = sdk.images.build(
            "sdk-app",
            dockerfile="FROM python\nCOPY hello.txt /opt/\nRUN cat /opt/hello.txt\n",
            context=tmp_path / "ctx",
            on_log=seen.append,
        )
        assert image["name"] == "sdk-app" and image["scope"] == "tenant"
        assert {"log": "hi\n", "stream": "stdout"} in seen
        with pytest.raises(corral.CorralError) as failed:
            sdk.images.build("sdk-bad", dockerfile="FROM python\nRUN exit 4\n")
        assert failed.value.code == "build_failed"
        sdk.images.delete("sdk-app")
        assert "sdk-app" not in [i["name"] for i in sdk.images.list()["images"]]


def test_the_cli_builds_and_removes_on_the_server(url: str, tmp_path: Any) -> None:
    from click.testing import CliRunner

    from app.cli import main

    key = tenant(url, "cli")["Authorization"].removeprefix("Bearer ")
    (tmp_path / "notes.txt").write_text("cli notes\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM python\nCOPY notes.txt /opt/\nRUN cat /opt/notes.txt\n"
    )
    env = {"CORRAL_URL": url, "CORRAL_API_KEY": key}
    args = ["images", "build", "cli-img", "-f", str(tmp_path / "Dockerfile"), "--server"]
    built = CliRunner().invoke(main, args, env=env)
    assert built.exit_code == 0, built.output
    assert built.stdout.startswith("cli-img (") and "cli notes\n" in built.stderr
    listed = CliRunner().invoke(main, ["images", "ls"], env=env)
    assert "cli-img" in listed.stdout and "(tenant's)" in listed.stdout
    (tmp_path / "Dockerfile").write_text("FROM python\nRUN exit 5\n")
    broken = CliRunner().invoke(main, [*args[:2], "broken", *args[3:]], env=env)
    assert broken.exit_code == 1, broken.output
    assert "Error: Dockerfile line 2: RUN failed (exit 5)" in broken.stderr
    removed = CliRunner().invoke(main, ["images", "rm", "cli-img", "--server"], env=env)
    assert removed.exit_code == 0 and removed.stdout == "removed cli-img\n", removed.output


async def test_the_async_sdk_builds_too(url: str) -> None:
    key = tenant(url, "async-sdk")["Authorization"].removeprefix("Bearer ")
    seen: list[dict[str, Any]] = []
    async with corral.AsyncCorral(url, key) as sdk:
        archive = context_archive({"a.txt": "async\n"}, gzip=False)
        dockerfile = "FROM python\nCOPY a.txt /opt/\nRUN cat /opt/a.txt\n"
        image = await sdk.images.build(
            "async-app", dockerfile=dockerfile, context=archive, on_log=seen.append
        )
        assert image["name"] == "async-app"
        assert {"log": "async\n", "stream": "stdout"} in seen
        with pytest.raises(corral.BuildFailed):
            await sdk.images.build("async-bad", dockerfile="FROM python\nRUN false\n")
        await sdk.images.delete("async-app")
        with pytest.raises(corral.NotFound):
            await sdk.images.get("async-app")
