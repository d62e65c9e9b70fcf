"""From runs to an answer: curves and their areas (``analysis``), the statistics (``stats``), factorial
effects (``factorial``), the verdict in words (``verdicts``), plots and the review table of every run."""
