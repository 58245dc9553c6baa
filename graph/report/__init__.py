"""What a run tells its user: the table (:mod:`.table`), the progress line (:mod:`.progress`),
where the time went (:mod:`.breakdown`), tracebacks at the user's file and line
(:mod:`.tracebacks`), step warnings shown once (:mod:`.stepwarnings`) and Dask's log digested
(:mod:`.logdigest`). Imports ``graph.compiling``, ``graph.tasks`` and ``graph.state`` below it.
"""

__all__: list[str] = []
