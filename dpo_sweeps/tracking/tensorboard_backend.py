"""TensorBoard: event files written by torch.utils.tensorboard's SummaryWriter in each run's directory
(`<run dir>/<tracking.tensorboard.subdir>`), so `tensorboard --logdir <sweep dir>` shows every run of a
sweep. The run's settings go in the HParams plugin's records (the run's own directory, beside its
scalars), so the HParams tab compares runs by setting; the status is its session-end record and a text.

A resumed run writes a new event file in the same directory after reading what the old ones hold
(tensorboard's EventAccumulator), so no step is written twice; an upload that finds everything there
already (and the status written) writes no file at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.tracking.backend import RunEnd
from dpo_sweeps.tracking.run_info import RunInfo

# The metrics the HParams tab shows beside the settings (their values are the runs' scalars).
HPARAM_METRICS = ("eval/rewards/accuracies", "eval/loss", "train/loss", "perf/tokens_per_s",
                  "perf/peak_memory_gib")


def build(cfg: Config, run_dir: Path) -> TensorboardBackend:
    return TensorboardBackend(Path(run_dir) / cfg.tracking.tensorboard.subdir)


def _hparam_value(value: Any) -> Any:
    # The HParams plugin takes numbers, strings and booleans; null and lists are shown as text.
    return value if isinstance(value, (bool, int, float, str)) else str(value)


class TensorboardBackend:
    name = "tensorboard"

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.where = str(self.log_dir)
        self._writer_class = SummaryWriter
        self._writer = None
        self.continued = False
        self.ended_before = False  # the event files hold a status already (an earlier attempt or upload)

    @property
    def writer(self):
        if self._writer is None:  # opened at the first write: each opening is a new event file
            self._writer = self._writer_class(log_dir=str(self.log_dir), flush_secs=5)
        return self._writer

    def start(self, run: RunInfo, state: dict[str, Any] | None) -> dict[str, Any]:
        from torch.utils.tensorboard.summary import hparams

        self.continued = self.log_dir.is_dir() and any(self.log_dir.glob("events.out.tfevents.*"))
        if not self.continued:
            settings = {key: _hparam_value(value) for key, value in run.params.items()}
            settings.update({f"dpo_sweeps.{key}": value for key, value in run.tags.items()})
            experiment, session_start, _ = hparams(settings, {key: 0.0 for key in HPARAM_METRICS})
            for record in (experiment, session_start):
                self.writer.file_writer.add_summary(record)
            self.writer.add_text("run", ", ".join(f"{k}: {v}" for k, v in run.tags.items()), 0)
            self.writer.flush()
        return {"log_dir": self.where}

    def logged_steps(self) -> dict[str, int]:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        if not self.continued:
            return {}
        events = EventAccumulator(str(self.log_dir), size_guidance={"scalars": 0})
        events.Reload()
        self.ended_before = "status/text_summary" in events.Tags()["tensors"]
        return {tag: max(e.step for e in events.Scalars(tag)) for tag in events.Tags()["scalars"]}

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a killed run keeps what it logged (a resume does not log it again)

    def finish(self, end: RunEnd) -> None:
        if self.ended_before and self._writer is None:
            return  # nothing new: an upload again
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

        # The HParams plugin's session-end record (tensorboard's own protos; its summary module needs TensorFlow).
        status = api_pb2.STATUS_SUCCESS if end.status == "completed" else api_pb2.STATUS_FAILURE
        content = plugin_data_pb2.HParamsPluginData(session_end_info=plugin_data_pb2.SessionEndInfo(status=status),
                                                    version=metadata.PLUGIN_DATA_VERSION)
        self.writer.file_writer.add_summary(Summary(value=[Summary.Value(
            tag=metadata.SESSION_END_INFO_TAG, metadata=metadata.create_summary_metadata(content))]))
        text = end.status + (f" ({end.failure_kind})" if end.failure_kind else "")
        self.writer.add_text("status", text)
        self.writer.close()
