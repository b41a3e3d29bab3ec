"""dpo_sweeps.api, as a Python program uses it: compose a config, train it in that process, report."""

from __future__ import annotations

import json
import subprocess
import sys

from support import QUIET, REPO, cli_env

# One rank, four steps of a small synthetic task: the short settings of tests/integration/test_train.py.
SHORT = [*QUIET, "train.max_steps=4", "train.eval_every=0", "data.num_train_pairs=64", "data.num_eval_pairs=16",
         "train.batch_size=8"]

PROGRAM = """
import json, sys
from pathlib import Path
from dpo_sweeps import api
from dpo_sweeps.errors import InvalidConfig

short, where = json.loads(sys.argv[1]), Path(sys.argv[2])
heavy = [m for m in ("torch", "transformers") if m in sys.modules]
cfg = api.compose(short, run_dir=where / "sweep" / "0")
first = api.train(cfg)
again = api.train(cfg)  # the same config again: the completed run is read back, nothing trains
# A run that started and failed: a broken JSON line in the data, found once the run reads it.
(where / "prefs.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\\n{"prompt": broken\\n')
synthetic = [o for o in short if not o.startswith("data.")]  # the synthetic data's own settings
broken = api.train([*synthetic, "data=preference", f"data.path={where / 'prefs.jsonl'}",
                    f"hydra.run.dir={where / 'sweep' / '1'}"])
# Every setting the command refuses raises InvalidConfig before anything starts, each in its own directory.
refused = {}
for name, overrides in {"value": ["train.batch_size=6"], "negative beta": ["loss.beta=-1"],
                        "unread": ["fsdp.hybrid_group_size=2"], "option": ["fsdp=full_shrad"],
                        "grid": ["loss.beta=0.1,0.5"]}.items():
    try:
        api.train([*short, *overrides, f"hydra.run.dir={where / 'refused' / name}"])
        refused[name] = None
    except InvalidConfig as exc:
        refused[name] = [exc.kind, exc.setting, str(exc)]
report = api.report(where / "sweep")
print(json.dumps({"heavy_at_import": heavy, "status": [first.status, broken.status, broken.failure.kind],
                  "first": first.to_json(), "again": again.to_json(), "broken": broken.to_json(),
                  "refused": refused, "html": str(report.html), "text": report.text,
                  "configs": [(c["status"], c["tied_with_best"], c["rank_with_ties"]) for c in report.configs]}))
"""


def test_compose_train_and_report_from_python(tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(SHORT), str(tmp_path)], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["heavy_at_import"] == []
    assert out["status"] == ["completed", "failed", "data_error"]  # a Summary, read by attribute
    first = out["first"]
    on_disk = json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())
    assert first == on_disk  # the Summary is summary.json's record
    assert first["status"] == "completed" and first["metrics"]["steps"] == 4 and first["metrics"]["world_size"] == 1
    assert first["config"]["train"]["batch_size"] == 8 and "train.max_steps=4" in first["overrides"]
    assert out["again"] == first and "run already complete" in proc.stderr
    # A second run in the same process is a run of its own (the first left no rank of a process group behind);
    # one that started and failed is its failed summary, as summary.json has it.
    broken = out["broken"]
    assert broken == json.loads((tmp_path / "sweep" / "1" / "summary.json").read_text())
    assert broken["failure"]["kind"] == "data_error" and broken["failure"]["message"].startswith(
        f"data.path: '{tmp_path / 'prefs.jsonl'}' line 2")
    refused = out["refused"]
    for name, setting, start in [
        ("value", "train.batch_size", "train.batch_size: 6 is not a multiple"),
        ("negative beta", "loss.beta", "loss.beta: got -1.0 for loss=dpo (accepted: a number > 0"),
        ("unread", "fsdp.hybrid_group_size", "fsdp.hybrid_group_size: set, but not read here"),
        ("option", "fsdp", "fsdp: no option 'full_shrad' in conf/fsdp (accepted: did you mean fsdp=full_shard?"),
        ("grid", "loss.beta", "loss.beta: 0.1,0.5 is a sweep's grid of values (accepted: one value"),
    ]:
        assert refused[name] is not None, f"{name}: trained, not refused"
        kind, named, message = refused[name]
        assert (kind, named) == ("invalid_config", setting) and message.startswith(start), (name, message)
        assert "\n" not in message
        assert not (tmp_path / "refused" / name).exists()  # refused before anything was written, as the command is
    assert out["html"] == str(tmp_path / "sweep" / "report" / "report.html")
    assert "Best by perf/speed_per_memory" in out["text"]
    # Each config's ranking.csv row: the completed one alone is the best (tied with itself); the failed one is unranked.
    assert sorted(out["configs"], key=str) == sorted([["completed", True, 1], ["failed", None, None]], key=str)
    assert str(REPO) not in out["html"]
