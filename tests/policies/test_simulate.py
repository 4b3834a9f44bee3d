"""bench/simulate.py on tiny traces: same protocol, production policies and ledger."""

import json

import pytest



def write_trace(root, rel, values, gap=300):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": values}))
    return path


def test_it_reads_gang_size_type_and_region_from_the_trace_layout(simulator, tmp_path):
    sim = simulator
    gang = sim.load_trace(write_trace(tmp_path, "preemption/4-node/aws-x/us-east-2a_v100_1.json", [4] * 10), tmp_path)
    assert (gang.nodes, gang.instance_type, gang.region, gang.provider) == (4, "p3.2xlarge", "us-east-2", "aws")
    assert gang.available("count")[0] and not gang.available("nonzero-unavailable")[0]
    gcp = sim.load_trace(write_trace(tmp_path, "1-node/gcp-y/us-central1-b_c3-88.json", [0] * 10), tmp_path)
    assert (gcp.nodes, gcp.instance_type, gcp.region, gcp.provider) == (1, "c3-highcpu-88", "us-central1", "gcp")
    broken = write_trace(tmp_path, "bad/z_q_1.json", [1] * 10)
    broken.write_text('{"data": [1, 0]}')
    with pytest.raises(SystemExit, match="bad/z_q_1.json: not a trace file"):
        sim.load_trace(broken, tmp_path)


def test_costs_come_from_the_ledger_in_units_of_on_demand(simulator, tmp_path):
    sim = simulator
    always = write_trace(tmp_path, "a/us-east-1a_k80_1.json", [1] * 400)  # k80: not in the price book -> 0.3
    [outcome] = [o for o in sim.trace_outcomes((always, tmp_path, sim.DEFAULT_SPOT_RATIO, 1))
                 if (o.reading, o.factor, o.policy) == ("count", 2.0, "greedy")]
    assert outcome.cost_ratio == pytest.approx(0.3, abs=0.01) and outcome.met and outcome.lost_fraction == 0
    never = write_trace(tmp_path, "b/us-east-1a_k80_1.json", [0] * 400)
    for o in sim.trace_outcomes((never, tmp_path, sim.DEFAULT_SPOT_RATIO, 1)):
        if o.reading == "count":
            assert o.met and o.cost_ratio >= 0.999, o  # nothing cheaper than on-demand without spot


def test_a_tiny_run_prints_every_folder_and_reading_and_writes_the_plot(simulator, tmp_path, capsys):
    sim = simulator
    flaky = [1 if (i // 7) % 3 else 0 for i in range(300)]
    write_trace(tmp_path, "preemption/1-node/aws-t/us-east-1c_v100_1.json", flaky)
    write_trace(tmp_path, "preemption/2-node/aws-t/us-east-1f_v100_1.json", [min(2, v * 2) for v in flaky])
    png = tmp_path / "out.png"
    sim.main(["--traces", str(tmp_path), "--png", str(png), "--offsets", "3", "--jobs", "1"])
    out = capsys.readouterr().out
    for folder in ("preemption/1-node/aws-t", "preemption/2-node/aws-t"):
        for reading in ("count", "nonzero-unavailable"):
            assert sum(1 for line in out.splitlines() if line.startswith(folder) and reading in line) == 2
    assert "mean cost / on-demand, ours" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_names_every_miss(simulator):
    sim = simulator
    good = {"ours": (0.5, 1.0, 0.0), "uniform_progress": (0.6, 1.0, 0.0)}
    assert sim.check({("f", "count", 1.5): good}) == []
    late = {("f", "count", 1.5): {"ours": (0.5, 0.95, 0.0), "uniform_progress": (0.6, 1.0, 0.0)}}
    assert sim.check(late) == ["('f', 'count', 1.5): ours met 95% of deadlines"]
    dear = {("f", "count", 2.0): {"ours": (0.7, 1.0, 0.0), "uniform_progress": (0.6, 1.0, 0.0)}}
    misses = sim.check(dear)
    assert "ours costs 0.7000 > uniform progress 0.6000" in misses[0]
    assert "not cheaper than uniform progress on average" in misses[1]
