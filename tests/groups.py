"""Which tests share one pytest-xdist worker, and why (``make test`` runs the suite with
``--dist loadgroup``: a group's tests all run, one at a time, on one worker).

Most tests own everything they touch: a temporary dir, a SQLite file, a PostgreSQL
database, the worker's own Redis database (``tests/conftest.py``), a free port. The tests
of one group touch something of the host that has one name or one address for the whole
machine, so two of them must never run at once; tests of different groups share none of
it, so the groups run beside each other (and beside everything else):

* ``crun``: real containers (marker ``crun``) and the ``outside`` host.
  They share the sandboxes' cgroup parent (``corral-sandboxes``, where they have fixed names
  such as ``sbx-busy``), the default sandbox network (its /30s, its nftables table and
  its host-wide lock), ``/run/corral`` (LXCFS, corral-init) and the network namespace and
  veth of ``outside`` (``corral-test-outside``, ``10.214.0.0/30``).
* ``nsjail``: real jails (marker ``nsjail``, the SandboxFusion and verl clients among
  them). They share nsjail's cgroup v1 parent (``CORRAL``), and some look through the host's
  processes for what a jail left behind (nobody's ``sleep``, nsjail children). Real QEMU
  microVMs (marker ``microvm``) run here too: they share the VMs' cgroup v1 parent
  (``corral-vm``) and the user QEMU runs as, and under TCG each boot takes a core for
  seconds, which beside the jails' timed bursts (verl's runaway cases, judged against a
  30 s client timeout) would make those time out.
* ``integration``: real corral processes (marker ``integration``), killed and restarted
  with private PostgreSQL and Redis servers; they judge dead-node timeouts, so they run
  one at a time.
* ``browser``: Debian's chromium (marker ``browser``), one at a time.

A test that needs two of these (a browser test that starts a container) joins the first
of ``GROUPS`` it needs.

Any other test that uses a fixture built for more than one test (``scope="module"`` or
wider, outside ``tests/conftest.py``) runs with the other tests of that fixture's scope:
a module's tests with each other (``wasm_client``, ``verl_utils``), a package's with each
other (the wasm interpreters compiled once per session in ``tests/node/fncall/wasm``). Spread
over the workers, they would build it again on each, and again on one worker whenever
another module's test ran in between (pytest tears a module fixture down when the next
test is another module's).

A test joins its group by its markers and fixtures, so a new test needs no change here.
"""

from __future__ import annotations

import pytest

#: group -> the markers and fixtures that put a test in it, in order of precedence
GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "crun": (("crun",), ("outside",)),
    "nsjail": (("nsjail", "microvm"), ()),
    "integration": (("integration",), ()),
    "browser": (("browser",), ()),
}


#: where the fixtures of every test are defined (plugins: ""): not a reason to group
ROOT_FIXTURES = ("", "tests")


def group_of(item: pytest.Item) -> str | None:
    """The group ``item`` must run in, or None (any worker, beside anything)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    for group, (markers, needs) in GROUPS.items():
        if any(item.get_closest_marker(name) is not None for name in markers):
            return group
        if fixtures & set(needs):
            return group
    return _shared_fixture_scope(item)


def _shared_fixture_scope(item: pytest.Item) -> str | None:
    """The package (a conftest's session or package fixture) or module (a module or class
    fixture) whose tests share a fixture with ``item``, the widest; None if none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::", 1)[0]
    found: str | None = None
    for definitions in info.name2fixturedefs.values():
        for definition in definitions:
            if definition.baseid in ROOT_FIXTURES or definition.scope == "function":
                continue
            if definition.scope in ("session", "package") and not definition.baseid.endswith(".py"):
                return definition.baseid
            found = module
    return found


def assign_group(item: pytest.Item) -> None:
    """Mark ``item`` with ``xdist_group`` (which ``--dist loadgroup`` reads) if it has a
    group."""
    group = group_of(item)
    if group is not None and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(group))


def name_for_xdist(item: pytest.Item) -> None:
    """On a worker of ``--dist loadgroup``: end ``item``'s id with ``@<group>``, which is
    how the worker tells the scheduler the group. xdist (3.8) does it itself by setting
    ``item._nodeid``, which pytest 9.2 no longer reads (its ids are structured,
    ``item._id``; pytest-dev/pytest-xdist#1386): without this, every group's tests were
    spread over the workers. Nothing changes where xdist already did it."""
    marker = item.get_closest_marker("xdist_group")
    if marker is None or not hasattr(item, "_id"):
        return
    from _pytest.nodeid import NodeId

    name = str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    old = item._id
    if item.nodeid.endswith("@" + name) or not old.names:
        return
    # the suffix after the parameters, all of it in the last name: the id then reads the
    # same after a round trip through a report (path, names and params, rejoined)
    last = old.names[-1] + ("" if old.params is None else f"[{old.params}]") + "@" + name
    item._id = NodeId(path=old.path, names=(*old.names[:-1], last))
