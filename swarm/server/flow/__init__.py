"""Flow control: how much work the server starts. Admission refuses what could not train in time
(``admission``), the task mix starts groups at the configured ratios (``category_mix``), chat calls
are capped per credential and server-wide (``inflight``), and ``capacity`` measures the rates those
rules read. Below the episodes and the step loop; it knows no episode record."""
