"""One run on a cluster: the driver that feeds the state machine and carries out its
instructions (:mod:`.executor`), the run's options (:mod:`.options`), the scheduler-side monitor
(:mod:`.monitor`), the watchdog (:mod:`.watchdog`), where tasks start (:mod:`.spread`), shared
copies of hot inputs (:mod:`.sharedcopies`) and the run's scheduler plugins
(:mod:`.runplugins`). The top of ``graph``: it may import every other sub-package.
"""

__all__: list[str] = []
