"""The real guest agent (compiled for the host, run as an ordinary process whose two ports
are socketpairs) through ``AgentChannel``: commands, credit, terminals, files, users, and
hostile or malformed peers."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import pwd
import random
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from node.sandboxes.microvm.channel import AgentChannel, AgentError, AgentGone, GuestProcess
from node.sandboxes.microvm.frames import (
    HEADER,
    MAX_PAYLOAD,
    WINDOW,
    Frame,
    FrameType,
    decode,
    encode,
    encode_fields,
    field_map,
)
from tests.node.sandboxes.microvm.agent.conftest import (
    Agent,
    FdAgent,
    alive,
    descendants,
    spawn,
    stop,
    wait_gone,
)
from tests.requirements import missing

T = FrameType
PATH = "/usr/local/bin:/usr/bin:/bin"
#: the user commands and file requests act as (the agent takes other users as root only)
ME = str(os.geteuid())


async def start(
    channel: AgentChannel,
    *argv: str,
    env: dict[str, str] | None = None,
    cwd: str = "/",
    user: str = ME,
    stdin: bool = False,
    pty: tuple[int, int] | None = None,
) -> GuestProcess:
    return await channel.exec(
        argv=list(argv),
        env={"PATH": PATH} if env is None else env,
        cwd=cwd,
        user=user,
        stdin=stdin,
        pty=pty,
    )


async def collect(process: GuestProcess) -> tuple[bytes, bytes, int]:
    out, err = bytearray(), bytearray()
    status = -1
    async for kind, value in process.events():
        if kind == "exit":
            assert isinstance(value, int)
            status = value
        else:
            assert isinstance(value, bytes)
            (out if kind == "stdout" else err).extend(value)
    return bytes(out), bytes(err), status


async def run(channel: AgentChannel, *argv: str, **kwargs: object) -> tuple[bytes, bytes, int]:
    process = await start(channel, *argv, **kwargs)  # type: ignore[arg-type]
    try:
        return await collect(process)
    finally:
        await process.release()


async def test_hello_and_ping(agent: Agent) -> None:
    await agent.channel.hello(
        time_ns=1, entropy=os.urandom(64), hostname="vm", machine_id="ab" * 16
    )
    assert await agent.channel.ping(10) >= 0
    assert not agent.channel.closed


async def test_exec_output_and_status(agent: Agent) -> None:
    out, err, status = await run(agent.channel, "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (out, err) == (b"out\n", b"err\n")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3


async def test_environment_is_exact(agent: Agent) -> None:
    env = {"A": "1", "B": "x=y", "EMPTY": ""}
    out, _, status = await run(agent.channel, "/usr/bin/env", env=env)
    assert status == 0
    assert sorted(out.decode().splitlines()) == ["A=1", "B=x=y", "EMPTY="]


async def test_cwd(agent: Agent, tmp_path: Path) -> None:
    out, _, status = await run(agent.channel, "pwd", cwd=str(tmp_path))
    assert (out, status) == (f"{tmp_path}\n".encode(), 0)


async def test_stdin_round_trip_beyond_the_window(agent: Agent) -> None:
    payload = os.urandom(3 * WINDOW + 12345)
    process = await start(agent.channel, "cat", stdin=True)
    try:

        async def feed() -> None:
            await process.write_stdin(payload)
            await process.close_stdin()

        feeder = asyncio.create_task(feed())
        out, err, status = await collect(process)
        await feeder
    finally:
        await process.release()
    assert (out == payload, err, status) == (True, b"", 0)


async def test_missing_program(agent: Agent) -> None:
    _, err, status = await run(agent.channel, "no-such-program-here")
    assert os.WEXITSTATUS(status) == 127
    assert b"no-such-program-here" in err and b"not found" in err


async def test_not_executable(agent: Agent, tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    _, err, status = await run(agent.channel, str(script))
    assert os.WEXITSTATUS(status) == 126
    assert b"Permission denied" in err


async def test_signal_reaches_the_whole_session(agent: Agent) -> None:
    process = await start(agent.channel, "sh", "-c", "sleep 1000 & echo $!; wait")
    try:
        events = process.events()
        kind, value = await anext(events)
        assert kind == "stdout" and isinstance(value, bytes)
        child = int(value)
        assert alive(child)
        await process.signal(15)
        kind, status = await anext(events)
        assert kind == "exit" and isinstance(status, int)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 15
        assert not await wait_gone({child})
    finally:
        await process.release()


async def test_a_background_child_does_not_hold_the_exit(agent: Agent) -> None:
    """It keeps the pipes open; the command's exit still ends the exec (as with crun)."""
    out, _, status = await run(agent.channel, "sh", "-c", "sleep 1000 & echo done")
    assert (out, status) == (b"done\n", 0)


async def test_a_flooding_background_child_does_not_hold_the_exit(agent: Agent) -> None:
    out, _, status = await run(agent.channel, "sh", "-c", "yes & sleep 0.2; echo >&2 end")
    assert status == 0 and out.startswith(b"y\n")


async def test_flood_does_not_delay_ping_and_stays_bounded(agent: Agent) -> None:
    process = await start(agent.channel, "yes")
    try:
        for _ in range(400):
            if process.buffered >= WINDOW:
                break
            await asyncio.sleep(0.025)
        assert process.buffered == WINDOW  # the window is full: the guest stops there
        for _ in range(5):
            await agent.channel.ping(10)
        assert process.buffered == WINDOW
        events = process.events()
        kind, _ = await anext(events)  # taking bytes grants credit: more comes
        assert kind == "stdout"
    finally:
        await process.release()


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def test_an_exited_command_out_of_credit_does_not_spin_the_agent(agent: Agent) -> None:
    """The command exits with output left in its pipe and no credit: the agent waits for
    credit without polling the hung-up pipe in a loop."""
    process = await start(agent.channel, "head", "-c", str(WINDOW + 30000), "/dev/zero")
    try:
        for _ in range(500):
            if process.buffered >= WINDOW:
                break
            await asyncio.sleep(0.02)
        assert process.buffered == WINDOW
        await asyncio.sleep(0.2)  # (the command exits meanwhile)
        before = cpu_ticks(agent.process.pid)
        await asyncio.sleep(1)
        assert cpu_ticks(agent.process.pid) - before < 20  # spinning: about 100 a second
        out, _, status = await collect(process)
        assert (len(out), status) == (WINDOW + 30000, 0)
    finally:
        await process.release()


async def test_the_agent_keeps_no_descriptors(agent: Agent, tmp_path: Path) -> None:
    def descriptors() -> int:
        return len(os.listdir(f"/proc/{agent.process.pid}/fd"))

    await agent.channel.ping(10)
    before = descriptors()
    for i in range(20):
        await run(agent.channel, "sh", "-c", "cat; echo x >&2", stdin=False)
        process = await start(agent.channel, "true", pty=(10, 10), stdin=True)
        await collect(process)
        await process.release()
        path = str(tmp_path / f"f{i}")
        await agent.channel.write_file(path, chunks_of(b"abc"), user=ME, mode=0o600)
        assert await read_all(agent.channel, path, max_bytes=3) == b"abc"
        await agent.channel.list_dir(str(tmp_path), user=ME, depth=1)
        with pytest.raises(AgentError):
            await agent.channel.stat(f"{path}-none", user=ME)
    await agent.channel.ping(10)
    assert descriptors() == before


async def test_release_kills_a_running_command(agent: Agent) -> None:
    process = await start(agent.channel, "sh", "-c", "echo $$; exec sleep 1000")
    kind, value = await anext(process.events())
    assert kind == "stdout" and isinstance(value, bytes)
    await process.release()
    assert not await wait_gone({int(value)})
    assert await agent.channel.ping(10) >= 0


async def test_release_ends_waiting_readers_and_writers(agent: Agent) -> None:
    process = await start(agent.channel, "sleep", "1000", stdin=True)  # reads no input
    try:
        writer = asyncio.create_task(process.write_stdin(b"x" * (4 * WINDOW)))
        reader = asyncio.create_task(collect(process))
        for _ in range(500):
            if process._stream.send_credit == 0:
                break
            await asyncio.sleep(0.01)
        assert process._stream.send_credit == 0  # the writer waits for credit
        assert not writer.done() and not reader.done()
    finally:
        await process.release()
    await writer
    assert await reader == (b"", b"", -1)  # no exit: released first
    assert await agent.channel.ping(10) >= 0


async def test_pty_and_resize(agent: Agent) -> None:
    process = await start(
        agent.channel, "sh", "-c", "stty size; read x; stty size", stdin=True, pty=(80, 24)
    )
    try:
        events = process.events()
        seen = bytearray()
        while b"24 80" not in seen:
            kind, value = await anext(events)
            assert kind == "stdout" and isinstance(value, bytes)
            seen += value
        await process.resize(100, 30)
        await process.write_stdin(b"\n")
        out, err, status = await collect(process)
        assert b"30 100" in out and err == b"" and status == 0
    finally:
        await process.release()


async def test_resize_without_a_terminal(agent: Agent) -> None:
    process = await start(agent.channel, "true")
    try:
        with pytest.raises(AgentError) as caught:
            await process.resize(10, 10)
        assert caught.value.code == "not_a_terminal"
    finally:
        await process.release()


async def test_no_such_user(agent: Agent) -> None:
    with pytest.raises(AgentError) as caught:
        await start(agent.channel, "true", user="no-such-user-here")
    assert caught.value.code == "no_such_user"


async def test_exec_as_another_user(agent: Agent) -> None:
    if os.geteuid() != 0:
        missing("taking another user needs root")
    out, _, status = await run(agent.channel, "id", "-u", user="1000:1000")
    assert (out, status) == (b"1000\n", 0)


# ---- files ---------------------------------------------------------------------------


async def chunks_of(data: bytes, size: int = 100_000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def read_all(channel: AgentChannel, path: str, *, user: str = ME, max_bytes: int) -> bytes:
    entry, chunks = await channel.read_file(path, user=user, max_bytes=max_bytes)
    assert entry["type"] == "file"
    return b"".join([chunk async for chunk in chunks])


async def test_file_round_trip(agent: Agent, tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    path = str(tmp_path / "new" / "dir" / "blob")
    entry = await agent.channel.write_file(path, chunks_of(data), user=ME, mode=0o640)
    assert (entry["path"], entry["type"], entry["size"], entry["mode"]) == (
        path,
        "file",
        str(len(data)),
        "640",
    )
    assert (tmp_path / "new" / "dir").is_dir()
    back = await read_all(agent.channel, path, max_bytes=len(data))
    assert hashlib.sha256(back).hexdigest() == hashlib.sha256(data).hexdigest()


async def test_empty_file(agent: Agent, tmp_path: Path) -> None:
    path = str(tmp_path / "empty")
    entry = await agent.channel.write_file(path, chunks_of(b""), user=ME, mode=0o600)
    assert entry["size"] == "0"
    assert await read_all(agent.channel, path, max_bytes=0) == b""


async def test_read_past_max(agent: Agent, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 1000)
    with pytest.raises(AgentError) as caught:
        await agent.channel.read_file(str(tmp_path / "f"), user=ME, max_bytes=999)
    assert caught.value.code == "file_too_large"
    assert await agent.channel.ping(10) >= 0


async def test_read_a_directory_or_a_missing_file(agent: Agent, tmp_path: Path) -> None:
    for path, code in ((tmp_path, "invalid_path"), (tmp_path / "none", "path_not_found")):
        with pytest.raises(AgentError) as caught:
            await agent.channel.read_file(str(path), user=ME, max_bytes=10)
        assert caught.value.code == code


async def test_stat_list_mkdir_remove_move(agent: Agent, tmp_path: Path) -> None:
    channel = agent.channel
    base = str(tmp_path)
    made = await channel.make_dir(f"{base}/a/b", user=ME)
    assert (made["type"], made["name"], made["path"]) == ("dir", "b", f"{base}/a/b")
    (tmp_path / "a" / "b" / "f").write_text("hello")
    (tmp_path / "a" / "link").symlink_to("b/f")

    stat = await channel.stat(f"{base}/a/b/f", user=ME)
    assert (stat["type"], stat["size"], stat["owner"]) == (
        "file",
        "5",
        pwd.getpwuid(os.geteuid()).pw_name,
    )
    link = await channel.stat(f"{base}/a/link", user=ME)
    assert (link["type"], link["target"]) == ("symlink", "b/f")

    one = await channel.list_dir(f"{base}/a", user=ME, depth=1)
    assert [e["path"] for e in one] == [f"{base}/a/b", f"{base}/a/link"]
    two = await channel.list_dir(f"{base}/a", user=ME, depth=2)
    assert [e["path"] for e in two] == [f"{base}/a/b", f"{base}/a/b/f", f"{base}/a/link"]

    moved = await channel.move(f"{base}/a/b/f", f"{base}/g", user=ME)
    assert (moved["path"], moved["size"]) == (f"{base}/g", "5")
    assert not (tmp_path / "a" / "b" / "f").exists()

    removed = await channel.remove(f"{base}/a", user=ME)
    assert (removed["type"], removed["path"]) == ("dir", f"{base}/a")
    assert not (tmp_path / "a").exists()


async def test_file_errors(agent: Agent, tmp_path: Path) -> None:
    channel = agent.channel
    (tmp_path / "file").write_text("x")
    cases = [
        (channel.stat(f"{tmp_path}/none", user=ME), "path_not_found"),
        (channel.remove(f"{tmp_path}/none", user=ME), "path_not_found"),
        (channel.make_dir(f"{tmp_path}/file", user=ME), "path_exists"),
        (channel.list_dir(f"{tmp_path}/file", user=ME, depth=1), "not_a_directory"),
        (channel.stat("relative/path", user=ME), "invalid_path"),
        (channel.move(f"{tmp_path}/none", f"{tmp_path}/x", user=ME), "path_not_found"),
        (channel.stat(f"{tmp_path}/file", user="no-such-user-here"), "no_such_user"),
    ]
    for request, code in cases:
        with pytest.raises(AgentError) as caught:
            await request
        assert caught.value.code == code


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may write in, sticky as /tmp (tmp_path's parents are root's)."""
    path = Path(tempfile.mkdtemp(prefix="corral-vmagent-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path)


async def test_acting_as_a_user(agent: Agent, shared_dir: Path) -> None:
    if os.geteuid() != 0:
        missing("taking another user needs root")
    secret = shared_dir / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    with pytest.raises(AgentError) as caught:
        await agent.channel.read_file(str(secret), user="1000", max_bytes=100)
    assert caught.value.code == "permission_denied"
    with pytest.raises(AgentError) as caught:
        await agent.channel.remove(str(secret), user="1000:1000")
    assert caught.value.code == "permission_denied"

    path = str(shared_dir / "sub" / "mine")
    entry = await agent.channel.write_file(path, chunks_of(b"data"), user="1000", mode=0o644)
    assert (entry["uid"], entry["gid"]) == ("1000", "1000")
    assert os.stat(path).st_uid == 1000 and os.stat(shared_dir / "sub").st_uid == 1000
    assert await read_all(agent.channel, path, user="1000", max_bytes=4) == b"data"


async def test_write_where_the_user_may_not(agent: Agent, shared_dir: Path) -> None:
    if os.geteuid() != 0:
        missing("taking another user needs root")
    closed = shared_dir / "closed"
    closed.mkdir(mode=0o755)
    with pytest.raises(AgentError) as caught:
        await agent.channel.write_file(
            str(closed / "f"), chunks_of(b"x" * WINDOW * 2), user="1000", mode=0o644
        )
    assert caught.value.code == "permission_denied"
    assert not (closed / "f").exists()


# ---- the wire: retries, malformed hosts, hostile guests -------------------------------


def recv_frame(sock: socket.socket) -> Frame:
    """One frame from a blocking socket (a test speaking raw frames)."""
    raw = b""
    while len(raw) < HEADER.size or len(raw) < HEADER.size + HEADER.unpack(raw[:12])[0]:
        chunk = sock.recv(HEADER.size + MAX_PAYLOAD)
        assert chunk, "the peer closed the connection"
        raw += chunk
    frame, rest = decode(raw)
    assert rest == b""
    return frame


def test_retried_exec_starts_one_process(fd_agent: FdAgent) -> None:
    process, ctl, _ = fd_agent
    ctl.settimeout(10)
    request = encode_fields([("user", ME), ("cwd", "/"), ("arg", "sleep"), ("arg", "1000")])
    request += b"env=PATH=" + PATH.encode() + b"\0"
    ctl.sendall(encode(5, T.EXEC, request))
    first = recv_frame(ctl)
    ctl.sendall(encode(5, T.EXEC, request))
    second = recv_frame(ctl)
    assert first.type == second.type == T.STARTED
    assert first.payload == second.payload
    pid = int(field_map(first.payload)["pid"])
    assert descendants(process.pid) == {pid}
    ctl.sendall(encode(5, T.RELEASE) + encode(6, T.PING))
    assert recv_frame(ctl) == Frame(6, T.PONG)


@pytest.mark.parametrize(
    "garbage",
    [
        HEADER.pack(MAX_PAYLOAD + 1, 1, T.PING, 0),
        encode(1, T.HELLO, b"time_ns=1"),  # fields without their final NUL
        encode(1, T.STDOUT, b"x"),  # a type the host may not send
    ],
    ids=["too-large", "no-nul", "wrong-type"],
)
async def test_a_malformed_frame_ends_the_connection(fd_agent: FdAgent, garbage: bytes) -> None:
    """With --ctl-fd/--data-fd the agent ends cleanly (status 0) after ending its sessions;
    with --ctl/--data it reopens its ports (test_the_agent_reopens_its_ports)."""
    process, ctl, data = fd_agent
    channel = await AgentChannel.from_sockets(ctl.dup(), data.dup(), name="test-vm")
    try:
        command = await start(channel, "sleep", "1000")
        below = descendants(process.pid)
        assert below == {command.pid}
        channel._ctl_writer.write(garbage)
        with pytest.raises(AgentGone):
            await collect(command)
        assert channel.closed
        assert await asyncio.to_thread(process.wait, 10) == 0
        assert not await wait_gone(below)
    finally:
        await channel.close()


async def test_the_agent_reopens_its_ports(agent_binary: Path, tmp_path: Path) -> None:
    listeners = []
    for name in ("ctl.sock", "data.sock"):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listeners.append(listener)
        listener.bind(str(tmp_path / name))
        listener.listen(1)
        listener.settimeout(10)
    process = spawn(
        agent_binary, "--ctl", str(tmp_path / "ctl.sock"), "--data", str(tmp_path / "data.sock")
    )
    try:
        for round_ in range(2):
            ctl, _ = listeners[0].accept()
            data, _ = listeners[1].accept()
            channel = await AgentChannel.from_sockets(ctl, data, name="test-vm")
            try:
                assert await channel.ping(10) >= 0
                if round_ == 0:
                    channel._ctl_writer.write(HEADER.pack(MAX_PAYLOAD + 1, 1, T.PING, 0))
                    with pytest.raises(AgentGone):
                        await channel.ping(10)
                    assert process.poll() is None  # the agent runs on
            finally:
                await channel.close()
    finally:
        for listener in listeners:
            listener.close()
        process.kill()  # reconnecting forever: it does not end on its own
        stop(process)


@pytest.fixture
def fake_guest() -> Iterator[tuple[socket.socket, socket.socket, socket.socket, socket.socket]]:
    """Two socketpairs: (host ctl, host data, guest ctl, guest data)."""
    ctl_host, ctl_guest = socket.socketpair()
    data_host, data_guest = socket.socketpair()
    try:
        yield ctl_host, data_host, ctl_guest, data_guest
    finally:
        for s in (ctl_host, data_host, ctl_guest, data_guest):
            s.close()


async def test_a_guest_beyond_its_window_is_gone(
    fake_guest: tuple[socket.socket, socket.socket, socket.socket, socket.socket],
) -> None:
    ctl_host, data_host, ctl_guest, data_guest = fake_guest
    channel = await AgentChannel.from_sockets(ctl_host.dup(), data_host.dup(), name="fake")
    try:
        started = asyncio.create_task(start(channel, "yes"))
        request = await asyncio.to_thread(recv_frame, ctl_guest)
        assert request.type == T.EXEC
        ctl_guest.sendall(encode(request.stream, T.STARTED, b"pid=7\0"))
        command = await started
        chunk = encode(request.stream, T.STDOUT, b"y" * MAX_PAYLOAD)
        # (sent from a thread: the loop must read while the sockets fill)
        await asyncio.to_thread(data_guest.sendall, chunk * (WINDOW // MAX_PAYLOAD))
        assert await anext(command.events()) == ("stdout", b"y" * MAX_PAYLOAD)
        await asyncio.to_thread(data_guest.sendall, chunk * 2)  # credit for one, two sent
        with pytest.raises(AgentGone):
            await channel.ping(30)  # the fake guest never answers: the failure wakes it
        assert channel.closed  # (a ping that timed out would leave it open)
        with pytest.raises(AgentGone):
            async for _ in command.events():
                pass
        assert command.buffered <= WINDOW
    finally:
        await channel.close()


@pytest.mark.parametrize(
    "frame",
    [
        encode(999, T.PONG),  # a stream the host never opened
        encode(0, T.STDOUT, b"x"),  # a data type on the control port
        encode(0, T.ENTRY, b"name=x"),  # fields without their NUL
        HEADER.pack(MAX_PAYLOAD + 1, 0, T.PONG, 0),
    ],
    ids=["unknown-stream", "wrong-port", "no-nul", "too-large"],
)
async def test_a_malformed_guest_is_gone(
    fake_guest: tuple[socket.socket, socket.socket, socket.socket, socket.socket], frame: bytes
) -> None:
    ctl_host, data_host, ctl_guest, _ = fake_guest
    channel = await AgentChannel.from_sockets(ctl_host.dup(), data_host.dup(), name="fake")
    try:
        pinging = asyncio.create_task(channel.ping(30))
        await asyncio.to_thread(recv_frame, ctl_guest)
        ctl_guest.sendall(frame)
        with pytest.raises(AgentGone):
            await pinging
        assert channel.closed
    finally:
        await channel.close()


def test_random_frames_never_crash_the_agent(agent_binary: Path) -> None:
    """Random headers and payloads (fields of random bytes: no real path or command) on
    both ports: the agent ends the connection cleanly or answers; it never dies of a
    signal."""
    rng = random.Random(1234)
    for _ in range(30):
        ctl_host, ctl_guest = socket.socketpair()
        data_host, data_guest = socket.socketpair()
        fds = (ctl_guest.fileno(), data_guest.fileno())
        process = spawn(
            agent_binary, "--ctl-fd", str(fds[0]), "--data-fd", str(fds[1]), pass_fds=fds
        )
        try:
            ctl_guest.close()
            data_guest.close()
            for _ in range(40):
                payload = rng.randbytes(rng.randrange(0, 300))
                if rng.random() < 0.7:
                    payload = payload.replace(b"\0", b"") + b"\0"
                type_ = rng.choice([*T, 0, 5, 99, 0xFFFF])
                length = len(payload) if rng.random() < 0.95 else rng.randrange(1 << 32)
                frame = HEADER.pack(length, rng.randrange(4), type_, rng.randrange(2)) + payload
                with contextlib.suppress(OSError):
                    rng.choice((ctl_host, data_host)).sendall(frame)
        finally:
            ctl_host.close()
            data_host.close()
            stop(process)
        assert process.returncode == 0


async def test_fake_guest_replies(
    fake_guest: tuple[socket.socket, socket.socket, socket.socket, socket.socket],
) -> None:
    """A ping that times out leaves the channel open; late frames of a stream the host is
    done with are dropped; an ERROR reply raises AgentError; a wrong version is gone."""
    ctl_host, data_host, ctl_guest, data_guest = fake_guest
    channel = await AgentChannel.from_sockets(ctl_host.dup(), data_host.dup(), name="fake")
    try:
        with pytest.raises(AgentGone):
            await channel.ping(0.05)
        assert not channel.closed
        ping = await asyncio.to_thread(recv_frame, ctl_guest)
        ctl_guest.sendall(encode(ping.stream, T.PONG))  # late: dropped
        await asyncio.to_thread(data_guest.sendall, encode(ping.stream, T.STDOUT, b"late"))

        statting = asyncio.create_task(channel.stat("/x", user=ME))
        request = await asyncio.to_thread(recv_frame, ctl_guest)
        assert request.type == T.STAT
        assert field_map(request.payload) == {"user": ME, "path": "/x"}
        error = encode_fields({"code": "path_not_found", "message": "/x: no"})
        ctl_guest.sendall(encode(request.stream, T.ERROR, error))
        with pytest.raises(AgentError) as caught:
            await statting
        assert (caught.value.code, caught.value.message) == ("path_not_found", "/x: no")
        assert not channel.closed

        hello = asyncio.create_task(
            channel.hello(time_ns=1, entropy=b"\0" * 64, hostname="h", machine_id="0" * 32)
        )
        request = await asyncio.to_thread(recv_frame, ctl_guest)
        assert request.type == T.HELLO and request.stream == 0
        ctl_guest.sendall(encode(0, T.HELLO_OK, b"version=2\0pid=1\0"))
        with pytest.raises(AgentGone):
            await hello
        assert channel.closed
    finally:
        await channel.close()


async def test_connect_to_the_sockets_qemu_serves(agent_binary: Path, tmp_path: Path) -> None:
    """As with QEMU: the host connects to two listening Unix sockets; the agent gets the
    accepted ends (here as descriptors)."""
    with pytest.raises(AgentGone):
        await AgentChannel.connect(
            str(tmp_path / "none.sock"), str(tmp_path / "none2.sock"), timeout=5
        )
    listeners = []
    accepted: list[socket.socket] = []
    process = None
    try:
        for name in ("ctl.sock", "data.sock"):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listeners.append(listener)
            listener.bind(str(tmp_path / name))
            listener.listen(1)
        channel = await AgentChannel.connect(
            str(tmp_path / "ctl.sock"), str(tmp_path / "data.sock"), timeout=5, name="vm-1"
        )
        try:
            accepted = [listener.accept()[0] for listener in listeners]
            fds = (accepted[0].fileno(), accepted[1].fileno())
            process = spawn(
                agent_binary, "--ctl-fd", str(fds[0]), "--data-fd", str(fds[1]), pass_fds=fds
            )
            for s in accepted:
                s.close()
            assert await channel.ping(10) >= 0
            out, _, status = await run(channel, "echo", "hi")
            assert (out, status) == (b"hi\n", 0)
        finally:
            await channel.close()
    finally:
        for s in (*listeners, *accepted):
            s.close()
        if process is not None:
            stop(process)
            assert process.returncode == 0
