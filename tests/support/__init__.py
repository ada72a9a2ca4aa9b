"""Shared test support: fakes and helpers that test modules import (conftest.py files hold only fixtures).

- ``clock``: the one ``FakeClock`` that unit tests inject and advance.
- ``procs``: real fleetserve processes on 127.0.0.1 (free ports, spawn, wait for HTTP, a replica).
- ``rawserver``: scripted raw TCP/HTTP servers and request/response helpers.
- ``fake_replica``: an in-process fake KServe replica (aiohttp) for gateway tests.
- ``gateways``: in-process gateway configuration for tests.
- ``fake_models``: served models computing with numpy, for the KServe front ends.
- ``kserve_strategies``: hypothesis strategies that fuzz KServe requests.
- ``target``: a scriptable HTTP target for the load generator.
- ``jwt_keys``: signing keys, token claims and an echo downstream for the edge guards.
- ``tiny_encoder``: a real tiny ONNX encoder behind the Engine protocol, for batching tests.
- ``reports``: a synthetic load-generator result and its report.
- ``markers``: skip markers for optional dependencies.
- ``waiting``: waiting on a real condition with a deadline, never for a guessed time.
"""
