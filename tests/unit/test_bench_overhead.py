"""bench/overhead.py's paired ratios: round by round, and the Young/Daly side with its saves' own time taken out."""

from bench.overhead import round_ratios


def _run(steps: int, span_s: float, save_s: float = 0.0) -> dict:
    return {"steps_per_s": steps / span_s, "span_s": span_s, "periodic_save_s": save_s}


def test_the_ratios_pair_each_round_with_its_own_plain_run():
    runs = {"baton": [_run(100, 10), _run(100, 20)], "plain": [_run(100, 10), _run(100, 10)]}
    r = round_ratios(runs, "baton", "plain")
    assert r["rounds"] == [1.0, 0.5] and r["lowest"] == 0.5 and r["highest"] == 1.0
    assert round_ratios({"baton": [], "plain": []}, "baton", "plain") is None


def test_net_of_saves_takes_only_the_saves_time_out_of_the_span():
    # 100 steps in 10 s, 2 of them in saves: 12.5 steps/s net against a plain 10/s.
    runs = {"baton_yd": [_run(100, 10, save_s=2.0)], "plain": [_run(100, 10)]}
    assert round_ratios(runs, "baton_yd", "plain", net_of_saves=True)["rounds"] == [1.25]
    # The control: the same run counted whole is at the plain loop's pace.
    assert round_ratios(runs, "baton_yd", "plain")["rounds"] == [1.0]
