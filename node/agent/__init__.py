"""The node agent: the data plane's process (``corral node``, or embedded in ``corral serve``).

* ``settings``   ``NodeSettings``: what a node can be told (no database, no admin key)
* ``transport``  the seam to the control plane (``NodeTransport``), ``Delivery``, ``Claim``
* ``redis``      ``RedisNodeTransport``: job streams in, claim script, results out
* ``agent``      ``NodeAgent``: claim, run, finish; heartbeats with capacity and warm pools
* ``metrics``    the node's own Prometheus registry
* ``http``       the node's ``/healthz`` and ``/metrics`` listener
* ``main``       ``running_node`` and ``run_node`` (``corral node``)

Nothing here imports the control plane (``app``); both planes import ``wire``.
"""
