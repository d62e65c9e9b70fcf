"""Training runs: their record (run.json, ``record``) and status (``status``), where they are placed
(``resources``) and how they are started, watched and stopped, locally (``launcher``, on top of
``processes``: a run's server and client commands, environment and tokens) or on Ray
(``ray_launcher``, ``ray_entry``); their log files (``logs``); what an ended run's checkpoints keep
(``shedding``).

The study code a run executes: the box it runs in (``sandbox``), the checks it passes before it
trains (``preflight``) and the smoke run among them (``smoke``). ``detached`` is the process
mechanism under all of them: start a process in its own session, find it again by pid and start
time, stop its whole group."""
