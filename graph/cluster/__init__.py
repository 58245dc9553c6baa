"""The cluster a run goes to: connecting or starting one (:mod:`.connect`), the kept embedded
cluster (:mod:`.embedded`), how its workers start (:mod:`.workerstart`,
:mod:`.forkserver_preload`) and what they run with (:mod:`.workerenv`), the warm-up of their
imports (:mod:`.warmup`), the bridge worker in the user's process (:mod:`.bridge`) and quiet
heartbeats at close (:mod:`.heartbeats`). Imports everything below it (memory, dashboard,
report, ...), never ``graph.run``.
"""

__all__: list[str] = []
