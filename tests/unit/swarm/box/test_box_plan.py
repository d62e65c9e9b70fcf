"""What the box shows study code (``swarm.box.BoxPlan``), read from the bubblewrap command line it builds:
no bubblewrap needed (the escape tests that run it are ``integration/swarm_client/test_box.py``)."""

from __future__ import annotations

from pathlib import Path

from swarm.box import BoxPlan


def _mounts(argv: list[str]) -> list[tuple[str, ...]]:
    """The mount options in order: (option, path) or (option, source, target)."""
    out: list[tuple[str, ...]] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        arg = argv[i]
        if arg in ("--ro-bind", "--bind", "--ro-bind-try", "--symlink"):
            out.append((arg, argv[i + 1], argv[i + 2]))
            i += 3
        elif arg in ("--tmpfs", "--chdir", "--remount-ro"):
            out.append((arg, argv[i + 1]))
            i += 2
        elif arg == "--size":
            out.append((arg, argv[i + 1], argv[i + 2], argv[i + 3]))  # --size N --tmpfs PATH
            i += 4
        else:
            i += 1
    return out


def test_the_run_folder_is_a_sized_tmpfs_and_the_study_is_read_only_inside_it(tmp_path: Path) -> None:
    run_dir, study_dir = tmp_path / "run", tmp_path / "run" / "study"  # the study folder inside the run folder
    argv = BoxPlan(run_dir=run_dir, study_dir=study_dir, disk_mb=8).bwrap_argv("bwrap", ["swarm", "run", "client.py"])
    mounts = _mounts(argv)
    tmpfs = mounts.index(("--size", str(8 << 20), "--tmpfs", str(run_dir)))
    study = mounts.index(("--ro-bind", str(study_dir), str(study_dir)))
    assert tmpfs < study  # parents first: the tmpfs does not cover the read-only study
    assert argv[-4:] == ["--", "swarm", "run", "client.py"] and ("--chdir", str(run_dir)) in mounts
    assert ("--remount-ro", "/") in mounts
    for flag in ("--unshare-all", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"


def test_secrets_under_a_visible_folder_are_masked_and_outputs_outlive_the_box(tmp_path: Path) -> None:
    shared, state = tmp_path / "shared", tmp_path / "shared" / "server-state"
    elsewhere, metrics = tmp_path / "other" / "token", tmp_path / "out" / "metrics.jsonl"
    plan = BoxPlan(run_dir=tmp_path / "run", study_dir=tmp_path / "study", read_only=[shared],
                   hidden=[state, elsewhere], outputs=[metrics])
    mounts = _mounts(plan.bwrap_argv("bwrap", ["true"]))
    assert ("--tmpfs", str(state)) in mounts  # a read-only path would show it: masked
    assert ("--tmpfs", str(elsewhere)) not in mounts  # nothing shows it: nothing to mask
    assert ("--bind", str(metrics), str(metrics)) in mounts  # read-write, the real file
    assert mounts.index(("--ro-bind", str(shared), str(shared))) < mounts.index(("--tmpfs", str(state)))
