"""bench/scaling_image.py's report: ratios pair the 1- and 2-peer runs of one round, the median
is judged against issue 19's goals, and the link bound follows T2 >= max((Mc + L) / 2, L + c)."""

from bench.scaling_image import image_runs, report_image


def _peer(compute, encode=0.0):
    return {"compute_wall": compute, "encode": encode, "decode": 0.0, "apply": 0.0,
            "messages_out": 1.0, "messages_in": 1.0, "bytes_out": 50_000.0}


def _row(rnd, n, step, peers, variant=None):
    return {"round": rnd, "run": "batch 64", "net": "delay", "n": n, "step_s": step, "peers": peers,
            "bytes_per_step": 100_000.0 if n == 2 else 0.0, "hash": "h", "hashes_agree": True,
            "load": 1.0, "variant": variant}


def test_report_pairs_rounds_and_judges_the_median():
    mesh = [_row(0, 1, 0.016, [_peer(0.016)]),
            _row(0, 2, 0.010, [_peer(0.009), _peer(0.004)]),            # 1.6x
            _row(1, 1, 0.032, [_peer(0.032)]),                          # a loaded round
            _row(1, 2, 0.040, [_peer(0.012), _peer(0.004)]),            # 0.8x
            _row(1, 2, 0.020, [_peer(0.012), _peer(0.004)], "SCALING_SCTP_BURST=32")]
    results = {"meta": {"cpus": 2, "load_start": [1.0], "load_end": [1.0], "layers": "(image default)",
                        "model": "conv2d", "params": 29066, "n_micro": {"batch 64": 4},
                        "batch": {"batch 64": 64}},
               "mesh": mesh, "raw": {"delay": {"bytes": 50_000, "rtt_s": 0.003, "rate_Bps": 5e6}}}
    text = report_image(results)
    assert "| batch 64 | 1 ms each way (user space) | as shipped | 1.60x, 0.80x | 1.20x | >= 1.3x: NOT met |" in text
    assert "| SCTP burst 32 chunks | 1.60x | 1.60x | >= 1.3x: met |" in text
    # c = median(16, 32 ms) / 4 = 6 ms; L = median(10 - 4, 40 - 4) = 21 ms; T1 = 24 ms:
    # T2 >= max((24 + 21) / 2, 21 + 6) = 27 ms -> 0.89x
    assert "| batch 64 | 1 ms each way (user space) | 6.00 | 4 | 21.0 | 0.89x | 1.20x |" in text
    assert "one 50,000 B message 10.0 ms (5.0 MB/s)" in text


def test_image_runs_scale_steps_down_with_the_batch():
    runs = image_runs("conv8,pool", "64,256", 60)
    assert runs["batch 64"] == ["--task", "image", "--batch", "64", "--steps", "60", "--layers", "conv8,pool"]
    assert runs["batch 256"][runs["batch 256"].index("--steps") + 1] == "24"
