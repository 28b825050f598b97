"""The invocation lifecycle on the control plane.

* ``limits``      what a request asks for, checked against the quota (one place)
* ``service``     ``Invocations``: admit, record with the dispatch intent, dispatch, wait
* ``waiters``     requests waiting for their row to be stored
* ``recorder``    the one writer of what nodes report; settles only after storing
* ``reconciler``  hands out again or fails what was lost; adopts dead gateways' results
* ``leader``      electing the one reconciler (advisory lock, or a file lock)
* ``projection``  what every answer shows of a stored row
"""
