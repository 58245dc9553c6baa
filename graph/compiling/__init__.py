"""From a pipeline's description (``graph.spec``) to one Dask graph.

:mod:`.compiler` (deterministic keys, shared prefixes as one task, the choose points),
:mod:`.collections` (Dask collections as step values), :mod:`.transform` (the store and
once-only rewrites), :mod:`.packing` (training branches packed into one task) and
:mod:`.tokencache`. Imports ``graph.tasks`` and ``graph.state`` below it, never the run.
(Named ``compiling``: ``graph.compile`` is the public function.)
"""

__all__: list[str] = []
