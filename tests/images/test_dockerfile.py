"""``corral images build -f Dockerfile`` on a small local image (busybox, built in the
test in milliseconds): RUN, COPY, ENV, ARG, WORKDIR, USER, CMD, and what is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from images import ImageBuildError, ImageStore
from images.digest import summarize
from images.dockerfile import build
from images.fsutil import mounts_under
from images.instructions import expand, parse

DOCKERFILE = """\
# a comment
ARG BASE=base
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/srv/app MODE="fast mode"
WORKDIR $APP_HOME
COPY app/ ./
COPY --chown=user:user notes.txt /home/user/
RUN echo "$GREETING from $(id -u) in $(pwd)" > built-by-root.txt \\
    && mkdir -p /data && chown user /data \\
    && test -e /proc/self/status && test -c /dev/null && echo ok > /data/mounts
USER user
RUN ["/bin/sh", "-c", "id -u > /data/uid; echo \\"$MODE\\" > /data/mode; echo $HOME > /data/home"]
EXPOSE 8080
CMD ["sh", "-c", "echo hi"]
"""


@pytest.fixture
def context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "app/lib").mkdir(parents=True)
    (ctx / "app/main.sh").write_text("echo main\n")
    (ctx / "app/main.sh").chmod(0o755)
    (ctx / "app/lib/util.sh").write_text("echo util\n")
    (ctx / "app/lib/link").symlink_to("util.sh")
    (ctx / "notes.txt").write_text("notes\n")
    return ctx


def dockerfile(ctx: Path, text: str) -> Path:
    path = ctx / "Dockerfile"
    path.write_text(text)
    return path


def staging_is_empty(store: ImageStore) -> bool:
    return list((store.root / ".staging").iterdir()) == []


def test_build_on_a_local_image(store: ImageStore, busybox_image: str, context: Path) -> None:
    parent_rootfs = store.resolve("base").rootfs
    parent_digest = summarize(parent_rootfs).digest
    lines: list[str] = []
    from images import Progress

    image = build(
        store,
        "app",
        dockerfile(context, DOCKERFILE),
        context=context,
        progress=Progress(lines.append),
    )
    r = image.rootfs
    assert (r / "srv/app/main.sh").read_text() == "echo main\n"
    assert stat.S_IMODE((r / "srv/app/main.sh").stat().st_mode) == 0o755
    assert (r / "srv/app/main.sh").stat().st_uid == 0
    assert (r / "srv/app/lib/util.sh").read_text() == "echo util\n"
    assert (r / "srv/app/lib/link").readlink() == Path("util.sh")
    assert (r / "home/user/notes.txt").stat().st_uid == 1000
    assert (r / "srv/app/built-by-root.txt").read_text() == "hello from 0 in /srv/app\n"
    assert (r / "data/mounts").read_text() == "ok\n"
    assert (r / "data/uid").read_text() == "1000\n"
    assert (r / "data/mode").read_text() == "fast mode\n"
    assert (r / "data/home").read_text() == "/home/user\n"
    assert image.env == {
        "PATH": "/bin",
        "BASE": "1",
        "APP_HOME": "/srv/app",
        "MODE": "fast mode",
    }
    assert (image.user, image.workdir) == ("user", "/srv/app")
    assert image.cmd == ("sh", "-c", "echo hi") and image.entrypoint is None
    assert image.source == "dockerfile" and image.parent == busybox_image
    assert summarize(parent_rootfs).digest == parent_digest, "the parent is untouched"
    assert not (r / "etc/resolv.conf").exists(), "the build's resolv.conf is not kept"
    assert staging_is_empty(store) and mounts_under(store.root) == []
    assert any("line 6: WORKDIR $APP_HOME" in line for line in lines)
    assert any("EXPOSE ignored" in line for line in lines)


def test_from_a_registry_image_says_no_registry(store: ImageStore, context: Path) -> None:
    with pytest.raises(ImageBuildError, match="No container registry is reachable") as err:
        build(store, "x", dockerfile(context, "FROM python:3.12-slim\n"), context=context)
    assert "line 1: FROM: no local image 'python:3.12-slim'" in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("RUN true\n", "the first instruction must be FROM"),
        ("FROM base\nADD x.tar /\n", "line 2: ADD: ADD is not supported"),
        ('FROM base\nSHELL ["/bin/bash"]\n', "line 2: SHELL: this instruction is not"),
        ("FROM base\nFROM base\n", "multi-stage builds are not supported"),
        ("FROM base\nCOPY --from=build /a /b\n", "--from is not supported"),
        ("FROM base\nRUN --mount=type=cache,target=/x true\n", "--mount is not supported"),
        ("FROM base\nRUN <<EOF\n", "here-documents are not supported"),
        ("FROM base\nCOPY ../secret /\n", "outside the build context"),
        ("FROM base\nCOPY missing.txt /\n", "matches nothing"),
        ("FROM base\nUSER nobody-here\n", "user 'nobody-here' does not exist"),
    ],
)
def test_unsupported_or_wrong_instructions_are_refused(
    store: ImageStore, busybox_image: str, context: Path, text: str, message: str
) -> None:
    with pytest.raises(ImageBuildError) as err:
        build(store, "x", dockerfile(context, text), context=context)
    assert message in str(err.value)
    assert [i.name for i in store.list()] == ["base"]
    assert staging_is_empty(store)


def test_copy_source_symlinked_out_of_the_context_is_refused(
    store: ImageStore, busybox_image: str, context: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret").write_text("host secret")
    (context / "sneaky").symlink_to(tmp_path / "secret")
    with pytest.raises(ImageBuildError, match="resolves outside the build context"):
        build(store, "x", dockerfile(context, "FROM base\nCOPY sneaky /\n"), context=context)


def test_copy_through_an_image_symlink_stays_in_the_tree(
    store: ImageStore, busybox_image: str, context: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    text = f"FROM base\nRUN ln -s {outside} /escape\nCOPY notes.txt /escape/\n"
    image = build(store, "x", dockerfile(context, text), context=context)
    assert list(outside.iterdir()) == []
    assert (image.rootfs / outside.relative_to("/") / "notes.txt").read_text() == "notes\n"


def test_a_failing_run_leaves_nothing(store: ImageStore, busybox_image: str, context: Path) -> None:
    text = "FROM base\nRUN echo about to fail && exit 3\n"
    with pytest.raises(ImageBuildError, match="line 2: RUN failed \\(exit 3\\)") as err:
        build(store, "x", dockerfile(context, text), context=context)
    assert "about to fail" in str(err.value)
    assert [i.name for i in store.list()] == ["base"]
    assert staging_is_empty(store) and mounts_under(store.root) == []


def test_from_scratch(store: ImageStore, context: Path, require_root: None) -> None:
    image = build(
        store, "files", dockerfile(context, "FROM scratch\nCOPY notes.txt /\n"), context=context
    )
    assert sorted(p.name for p in image.rootfs.iterdir()) == ["notes.txt"]
    assert image.parent is None and image.user == "root"


def test_parse_continuations_comments_and_flags() -> None:
    text = "FROM a\nRUN one \\\n  # inside\n  two\nCOPY --chown=1:2 x y\n\nENV A=1\n"
    got = [(i.keyword, i.args, i.line, i.flags) for i in parse(text)]
    assert got == [
        ("FROM", "a", 1, ()),
        ("RUN", "one  two", 2, ()),
        ("COPY", "x y", 5, (("chown", "1:2"),)),
        ("ENV", "A=1", 7, ()),
    ]


def test_expand() -> None:
    env = {"A": "1", "B": "two"}
    assert expand("$A/${B}/${C:-three}/$D.", env) == "1/two/three/."


def test_the_cli_builds_with_a_context(
    store: ImageStore, busybox_image: str, context: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from app.cli import main

    elsewhere = tmp_path / "df"
    elsewhere.mkdir()
    path = dockerfile(elsewhere, "FROM base\nCOPY notes.txt /n.txt\n")
    result = CliRunner().invoke(
        main,
        ["images", "build", "cli-app", "-f", str(path), "--context", str(context)],
        env={"CORRAL_IMAGES_DIR": str(store.root)},
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("cli-app sha256:")
    assert (store.resolve("cli-app").rootfs / "n.txt").read_text() == "notes\n"
    assert os.path.exists(store.resolve("base").rootfs / "bin/busybox")
