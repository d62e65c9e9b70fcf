"""``researcher start --data`` by dataset folder or name (issue #50): the dataset is loaded once and
snapshotted into the study's task folder, the study records the name and the keys, and the generated
client reads the snapshot with ``--prompt-key`` / ``--answer-key``; a name that cannot be loaded
stops ``researcher start`` with exit 2 and the fetch command before anything of the study is written."""

from __future__ import annotations

from pathlib import Path

from researcher.planner import catalog
from researcher.runs import sandbox
from researcher.study import datatask
from researcher.types.design import DATA_TASK
from researcher.types.settings import StudyOptions
from swarm.client import probe_study

ROOT = Path(__file__).resolve().parents[3]
ARITH = ROOT / "studies" / "examples" / "arith"
TOPIC = "Is a learning rate of 1e-3 better than 3e-4 on my data?"


def test_a_saved_dataset_is_snapshotted_and_read_with_its_keys(tmp_path: Path) -> None:
    import datasets

    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} and 1 make {i + 1}.\n#### {i + 1:,}"} for i in range(998, 1038)]
    saved = tmp_path / "gsm-like"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:32]),
                          "test": datasets.Dataset.from_list(rows[32:])}).save_to_disk(str(saved))
    task = tmp_path / "study" / "task" / DATA_TASK
    fields = datatask.options_for(saved, f"{saved}:test", "exact", 0, prompt_key="question", answer_key="answer",
                                  snapshot_dir=task)
    options = StudyOptions(**fields)
    assert (options.data, options.heldout) == (str(task / "data.parquet"), str(task / "heldout.parquet"))
    assert (options.data_name, options.heldout_name) == (str(saved), f"{saved}:test")
    assert options.data_sha256 == datatask.sha256(task / "data.parquet")
    root = datatask.write_task(options, tmp_path / "study", ARITH / "config.toml")
    client = catalog.examples(root)[DATA_TASK].client
    source = client.read_text()
    assert sandbox.check_client(source) is None
    assert "PROMPT_KEY = 'question'" in source and "ANSWER_KEY = 'answer'" in source
    report = probe_study(client)  # imports the client: build_study reads the snapshot with the keys
    assert report.ok, report.problems
    assert report.heldout == 8


def test_an_uncached_dataset_name_stops_the_study_before_it_starts(cli, tmp_path: Path) -> None:
    cli.env["HF_DATASETS_CACHE"] = str(tmp_path / "datasets")
    done = cli.run("start", "--topic", TOPIC, "--data", "acme/uncached:main", "--prompt-key", "question",
                   "--answer-key", "answer", "--study-id", "named", *cli.dirs, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    said = " ".join((done.stdout + done.stderr).split())
    assert "datasets.load_dataset('acme/uncached', 'main', split='train')" in said, said
    assert not (cli.studies / "named" / "study.toml").exists()
    assert not (cli.studies / "named" / "task" / DATA_TASK / "data.parquet").exists()
