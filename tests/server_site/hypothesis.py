"""Hides hypothesis from the Python processes tests start (brokers, WAL managers, tools).

``tests/conftest.py`` puts this directory first on their ``PYTHONPATH``. kio imports
``hypothesis.strategies`` whenever it can, which costs every broker start ~0.4 s of CPU for
nothing: production installs have no hypothesis, and servers never use it.
"""

raise ImportError("hypothesis is hidden from processes started by the tests (tests/server_site)")
