from __future__ import annotations

import json

from proxy.clock import ManualClock
from proxy.config import DiagnoseConfig
from proxy.diagnose import rules
from proxy.diagnose.report import render_text, to_json
from proxy.diagnose.service import Diagnoser, params_from_config
from proxy.diagnose.window import DiagnosisWindows
from proxy.routing.base import WorkerSnapshot
from tests.unit.diagnose_builders import chain, record


def round_robin_fleet(clock: ManualClock) -> Diagnoser:
    """Two workers, round robin over 4 shared prefixes; each worker's small cache keeps missing."""
    windows = DiagnosisWindows(clock, max_requests=500, max_age_s=0)
    for i in range(120):
        windows.record(record(worker=f"http://w{i % 2}", received=i * 0.1, prefill=0.05, gaps=(0.01,) * 5,
                              blocks=chain(i % 4, 8), cached=0, policy="round_robin"))
    for _ in range(10):
        windows.observe([WorkerSnapshot(f"http://w{k}", running=3, max_running_requests=16, token_usage=0.3,
                                        queued=0, max_total_tokens=512) for k in range(2)])
    cfg = DiagnoseConfig(price_per_gpu_hour=2.0, refresh_s=5.0, thresholds={"min_requests": 20})
    return Diagnoser.from_config(cfg, windows, clock)


def test_json_carries_signals_with_their_window_verdict_evidence_and_cost() -> None:
    clock = ManualClock(100.0)
    doc = to_json(round_robin_fleet(clock).diagnose())
    json.dumps(doc)  # serialisable as is
    assert doc["verdict"]["kind"] == rules.TUNE
    finding = doc["verdict"]["findings"][0]
    assert finding["rule"] == "cache_routing" and finding["cause"] == "routing"
    assert any(e["holds"] for e in finding["evidence"])
    captured = doc["signals"]["cache_hit_rate_captured"]
    assert captured["value"] == 0.0 and captured["n"] == 120 and captured["window_s"] > 0
    assert doc["signals"]["cache_hit_rate_available"]["value"] > 0.9
    # the model's estimate says so; measured signals carry no such mark
    assert doc["signals"]["ttft_unloaded_p95"]["estimated"] is True
    assert "estimated" not in doc["signals"]["ttft_p95"]
    assert doc["four_numbers"]["gpu_idle"]["available"] is False
    assert doc["four_numbers"]["gpu_idle"]["share"] is None
    assert set(doc["cost"]["stages"]) == {"queue", "prefill", "decode", "idle"}
    assert doc["cost"]["driver"] in doc["cost"]["stages"]
    assert doc["params"]["min_requests"] == 20
    assert doc["window"]["requests"] == 120 and doc["window"]["max_requests"] == 500


def test_text_block_shows_the_four_numbers_the_verdict_and_the_bill() -> None:
    text = render_text(to_json(round_robin_fleet(ManualClock()).diagnose()))
    assert "captured 0%" in text
    assert "GPU idle        unknown" in text
    assert "Verdict: TUNE" in text
    assert "routing.policy [radixgate]" in text
    assert "the bill is driven by" in text
    assert "$2/GPU-hour" in text


def test_current_reuses_a_fresh_diagnosis_and_recomputes_a_stale_one() -> None:
    clock = ManualClock()
    d = round_robin_fleet(clock)
    first = d.current()
    clock.advance(9.0)  # refresh_s 5: a result is reused up to 10 s
    assert d.current() is first
    clock.advance(2.0)
    assert d.current() is not first


def test_an_empty_window_is_insufficient_data_and_still_renders() -> None:
    clock = ManualClock()
    d = Diagnoser(DiagnosisWindows(clock), clock)
    doc = to_json(d.diagnose())
    assert doc["verdict"]["kind"] == rules.INSUFFICIENT
    assert "no dispatched requests" in render_text(doc)


def test_config_slo_sets_the_rule_slo() -> None:
    p = params_from_config(DiagnoseConfig(slo_ttft_p95_s=0.7, thresholds={"saturation": 0.8}))
    assert (p.slo_ttft_p95_s, p.saturation) == (0.7, 0.8)


def test_report_command_prints_a_saved_document(tmp_path, capsys) -> None:
    from proxy.diagnose.report import main

    saved = tmp_path / "diagnosis.json"
    saved.write_text(json.dumps(to_json(round_robin_fleet(ManualClock()).diagnose())))
    assert main(["--file", str(saved)]) == 0
    assert "Verdict: TUNE" in capsys.readouterr().out
    assert main(["--file", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]["kind"] == "tune"


def test_report_command_explains_what_it_cannot_read(tmp_path, capsys) -> None:
    from proxy.diagnose.report import main

    assert main(["--file", str(tmp_path / "missing.json")]) == 1
    (tmp_path / "other.json").write_text('{"hello": 1}')
    assert main(["--file", str(tmp_path / "other.json")]) == 1
    assert "not a /diagnosis document" in capsys.readouterr().err


def test_radixgate_report_subcommand_reaches_the_report(tmp_path, capsys) -> None:
    from proxy.cli import main as cli_main

    saved = tmp_path / "d.json"
    saved.write_text(json.dumps(to_json(round_robin_fleet(ManualClock()).diagnose())))
    assert cli_main(["report", "--file", str(saved)]) == 0
    assert "The four numbers" in capsys.readouterr().out
