"""The metrics log a resumed run appends to stays one JSON object per line."""
import json

from pmi_jax import metrics


def test_a_line_cut_by_a_kill_is_dropped_before_the_resumed_run_appends(tmp_path):
    logdir = tmp_path / "tensorboard"
    logdir.mkdir()
    (logdir / "metrics.jsonl").write_text('{"step": 10, "loss": 5.0}\n{"step": 20, "lo')  # killed mid-write
    writer = metrics.MetricWriter(str(logdir), enabled=True)
    writer.write(20, {"loss": 4.5})
    writer.close()
    lines = (logdir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 10, "loss": 5.0}, {"step": 20, "loss": 4.5}]
    assert metrics.read_metrics(str(logdir))[20]["loss"] == 4.5
