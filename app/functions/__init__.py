"""Tool functions: registered code with a JSON-in/JSON-out calling convention.

``languages`` names what can be registered, ``artifacts`` checks and hashes uploads,
``wasm_check`` inspects WebAssembly modules, ``schema`` validates input against the
registered JSON Schema, ``drivers`` wraps user code into a program that speaks the
convention, ``outcome`` turns a finished run back into a function result, and
``service`` ties them to the database and the executor. See ``docs/functions.md``.
"""
