"""Training runs: their record (run.json, ``record``) and status (``status``), where they are placed
(``resources``) and how they are started, watched and stopped, locally (``launcher``) or on Ray
(``ray_launcher``, ``ray_entry``)."""
