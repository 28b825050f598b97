"""The web console (``/console``): server-rendered pages over the same services and
endpoint handlers as the API, for the operator (admin key) and for tenants.

A console is signed in with an API key once; the browser then holds only a random
session token in an HttpOnly, SameSite=Strict cookie (``app.api.console.sessions``), never
the key. Every form that changes something carries the session's CSRF token, checked
before anything runs. Changes go through the API's own endpoint handlers
(``app.api.console.actions``), so a console action is validated, authorised and recorded
exactly as the same API call would be.
"""
