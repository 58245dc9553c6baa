"""What runs inside a Dask task on a worker, around the user's code.

The callables the compiled graph's tasks call (:mod:`.plainvalues`' ``PlainStep``,
:mod:`.iterative`'s ``Iterative`` and the report channel it speaks on, :mod:`.fusedmetric`'s
``ReadsMetrics``), how a step function is shipped (:mod:`.shipping`), the result store's files
(:mod:`.store`) and the once-only guard (:mod:`.rerun`). Imports the top-level vocabulary
(``graph.spec``, ``graph.keys``, ``graph.parcels``, ...) and the pure rules (``graph.state``) only;
``tests/test_layout.py`` checks the order of ``graph``'s sub-packages.
"""

__all__: list[str] = []
