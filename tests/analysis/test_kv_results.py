"""kv-eval's result of one model (pipeline.analysis.kv_results): its MLflow metrics and table rows follow its
streamed rows, on a hand-made entry."""

from pipeline import metric_names as N
from pipeline.analysis.kv_results import KvResult, markdown, row_key

ROWS = [("streaming", "keep"), ("streaming", "drop")]


def entry(rows=ROWS, passkey=None) -> dict:
    budget = {"entries": 150, "perplexity": {row_key(p, m): 2.0 + i for i, (p, m) in enumerate(rows)}}
    return {
        "full": None,
        "tokens": 1,
        "sequences": 1,
        "budgets": {"25": budget | ({"passkey": passkey} if passkey else {})},
    }


def test_metrics_and_table_of_a_hand_made_record():
    trials = [{"depth": 0.0, "key": 1}, {"depth": 1.0, "key": 2}]
    right = {"streaming/keep": 1, "streaming/drop": 1, "full": 2}
    accuracy = {"streaming/keep": 50.0, "streaming/drop": 50.0, "full": 100.0}
    result = KvResult(ROWS, entry(passkey={"2x": {"trials": trials, "right": right, "accuracy": accuracy}}))
    assert result.to_json() is result.entry
    assert result.metrics() == {
        N.kv_perplexity("streaming", "keep", 25): 2.0,
        N.kv_perplexity("streaming", "drop", 25): 3.0,
        N.kv_passkey("streaming_keep", 25, 2): 50.0,
        N.kv_passkey("streaming_drop", 25, 2): 50.0,
        N.kv_passkey("full", 25, 2): 100.0,
    }
    table = markdown({"m": result}, 4)
    assert "| m | 1 | n/a | 25% (150) | streaming | 2.00 | 3.00 | 1.50 | 1/2 | 1/2 |" in table
    assert "| m | 1 | n/a | 25% (150) | full cache | — | — | — | 2/2 | — |" in table


def test_rows_keep_their_order_and_name_their_curves():
    rows = [("h2o", "policy"), ("streaming", "policy")]
    result = KvResult(rows, entry(rows))
    table = markdown({"m": result}, 4).splitlines()
    assert [line.split(" | ")[4] for line in table if line.startswith("| m |")] == ["h2o", "streaming"]
    assert list(result.metrics()) == [N.kv_perplexity(p, m, 25) for p, m in rows]
    assert result.names() == {"h2o/policy": "h2o, own scores", "streaming/policy": "streaming, own scores"} | {
        "full": "full cache"
    }
