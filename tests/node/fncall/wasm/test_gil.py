"""``node.fncall.wasm.gil``: wasmtime's short calls keep the GIL, guest code never does."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from node.fncall.wasm import gil
from node.fncall.wasm.config import WasmConfig
from node.fncall.wasm.engine import WasmEngine

ROOT = Path(__file__).resolve().parents[4]


def test_an_engine_makes_the_short_calls_keep_the_gil_and_no_other(tmp_path: Path) -> None:
    engine = WasmEngine(WasmConfig(data_dir=tmp_path / "data", pooling=False))
    try:
        assert not set(gil.SHORT_CALLS) & set(gil.RELEASING_CALLS)
        assert [name for name in gil.SHORT_CALLS if not gil.keeps_gil(name)] == []
        assert [name for name in gil.RELEASING_CALLS if gil.keeps_gil(name)] == []
    finally:
        engine.close()


def test_a_binding_this_wasmtime_py_lacks_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gil, "_kept", {})
    monkeypatch.setattr(gil, "SHORT_CALLS", ("wasmtime_store_new", "wasmtime_no_such_call"))
    with pytest.raises(LookupError, match="wasmtime_no_such_call"):
        gil.keep_gil_in_short_calls()
    assert gil._kept == {}  # nothing rebound by half


#: A guest spinning on a thread of its own, in a start function (run while instantiating)
#: or in ``_start``, while this thread counts: it can only count if the spinning call
#: let go of the GIL. No ticker runs: the guest ends only when this thread, done counting,
#: moves the epoch past its deadline.
SPIN = textwrap.dedent(
    """
    import sys, threading, time
    from wasmtime import Module, Store, Trap, wat2wasm
    from node.fncall.wasm.config import WasmConfig
    from node.fncall.wasm.engine import WasmEngine

    engine = WasmEngine(WasmConfig(data_dir=sys.argv[1], pooling=False))
    body = {
        "start": '(func $spin (loop br 0)) (start $spin)',
        "_start": '(func (export "_start") (loop br 0))',
    }[sys.argv[2]]
    pre = engine.linker.instantiate_pre(Module(engine.engine, wat2wasm(f"(module {body})")))
    store = Store(engine.engine)
    store.set_epoch_deadline(1)
    ended = []

    def guest():
        try:
            instance = pre.instantiate(store)
            instance.exports(store)["_start"](store)
        except Trap as exc:
            ended.append(exc.trap_code)

    thread = threading.Thread(target=guest, daemon=True)
    thread.start()
    time.sleep(0.05)
    counted, until = 0, time.monotonic() + 0.2
    while time.monotonic() < until:
        counted += 1
    engine.engine.increment_epoch()
    thread.join(5)
    print(counted, ended)
    engine.close()
    """
)


@pytest.mark.parametrize("where", ["start", "_start"])
def test_a_spinning_guest_lets_other_threads_run(tmp_path: Path, where: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SPIN, str(tmp_path / "data"), where],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    counted, ended = done.stdout.split(" ", 1)
    assert int(counted) > 1000
    assert "INTERRUPT" in ended
