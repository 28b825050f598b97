"""The node, Corral's data plane: an agent that serves the gateway and the backends it
drives.

* ``agent``      the node agent: its registration, dispatch, HTTP listener and metrics
* ``fncall``     FnCall backends (``nsjail``, ``wasm``, ``fake``): one stateless call each
* ``sandboxes``  stateful sandboxes (``crun``); ``sandboxes/guest`` runs inside them
* ``pools``      the warm pools backends draw workers from
* ``settings``, ``artifacts``: what the agent hands the backends (which never import it)
"""
