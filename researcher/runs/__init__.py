"""Training runs: their record (run.json, ``record``) and status (``status``), where they are placed
(``resources``) and how they are started, watched and stopped, locally (``launcher``, on top of
``processes``: commands, environment, tokens) or on Ray (``ray_launcher``, ``ray_entry``); their log
files (``logs``) and the smoke run of a new client (``smoke``)."""
