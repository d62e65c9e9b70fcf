"""``python -m researcher.ray_entry``, the entry point of Ray jobs submitted before the module moved to
``researcher.runs.ray_entry`` (a resubmitted or still-queued job runs it by that name)."""

from researcher.runs.ray_entry import main

if __name__ == "__main__":
    main()
