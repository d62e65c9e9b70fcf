"""``researcher.scheduler:run_scheduled_resume``, the callable that scheduled jobs stored before the
scheduler moved to ``researcher.operations.scheduler`` name by text in their APScheduler job store
(``<artifacts>/scheduler.db``). The daemon leaves a stored job with an unchanged spec alone (to keep
its next run time), so such a job keeps this reference until its schedule changes; without this module
it would fail to load. New jobs name the new path. Nothing in the researcher imports this module.
"""

from researcher.operations.scheduler import run_scheduled_resume

__all__ = ["run_scheduled_resume"]
