"""The gradient noise scale (``gns=True``) and the batch size it picks (``adaptive_batch=``), on real DDP.

The problem has a known noise scale (see ``noisy_point``): the estimate from DDP's own
gradients must come within 2x of it, and the adaptive batch must move the way the
noise scale says (larger when the gradient is mostly noise, smaller when it is not),
with the learning rate following AdaScale's gain.
"""

from __future__ import annotations

import statistics

import pytest

import nbtrain

from _train_fns import noisy_point


def _rows(run: nbtrain.Run) -> list[dict]:
    return run.metrics


def test_the_noise_scale_estimate_is_within_2x_of_the_known_one(cluster):
    d, sigma, w = 16, 1.0, 0.25
    known = d * sigma**2 / (d * w**2)  # tr(Σ) / |G|² = 16
    run = nbtrain.launch(noisy_point, workers=2, gns=True, name="gns-known", config={
        "d": d, "sigma": sigma, "w": w, "lr": 0.0, "batch": 16, "examples": 2 * 16 * 150, "epochs": 1})
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    rows = [row for row in _rows(run) if row.get("gns") == row.get("gns") and row.get("gns") is not None]
    assert {row["rank"] for row in rows} == {0, 1}, "both ranks' rows carry gns"
    late = [row["gns"] for row in rows if row["step"] > 75]
    estimate = statistics.median(late)
    print(f"gns estimate {estimate:.3g}, known {known:.3g}")
    assert known / 2 <= estimate <= known * 2, f"gns {estimate:.3g} against the known {known:.3g}"


@pytest.mark.parametrize(("case", "w", "sigma", "batch", "grows"), [
    ("noise-dominated", 0.02, 1.0, 8, True),    # noise scale 2500 against a global batch of 16: larger pays
    ("signal-dominated", 0.25, 0.1, 32, False),  # noise scale 0.16 against 64: smaller does as well, cheaper
])
def test_the_adaptive_batch_moves_the_way_the_noise_scale_points(cluster, case, w, sigma, batch, grows):
    run = nbtrain.launch(noisy_point, workers=2, adaptive_batch=(4, 64), name=f"adaptive-{case}", config={
        "d": 16, "sigma": sigma, "w": w, "lr": 1e-6, "batch": batch, "examples": 2 * batch * 40, "epochs": 3})
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    rows = sorted((row for row in _rows(run) if row["rank"] == 0), key=lambda row: row["step"])
    sizes = [int(row["batch_size"]) for row in rows]
    assert sizes[0] == batch
    changed = next(i for i, size in enumerate(sizes) if size != batch)
    assert (sizes[changed] > batch) == grows, f"{case}: the batch went {batch} -> {sizes[changed]}"
    # the learning rate follows AdaScale's gain: up, but by less than the batch grew (or down with it)
    lr_before, lr_after = rows[changed - 1]["lr"], rows[changed]["lr"]
    if grows:
        assert lr_before < lr_after <= lr_before * sizes[changed] / batch * 1.0001
    else:
        assert lr_after < lr_before
    log = run.logs(rank=0)
    assert f"batch size {batch} -> {sizes[changed]} per rank" in log
