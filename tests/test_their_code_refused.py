"""What nbtrain refuses of the user's own Lightning and Ray Train code, decided before anything runs: a
Lightning strategy it does not have, Ray Train configs it cannot honour, a Ray it was not tested with.

Apart from ``test_lightning.py`` and ``test_ray_train_code.py``, whose runs need Lightning and torchvision
imported: the quick tier imports only the modules with quick tests, and these need neither."""

from __future__ import annotations

import pytest
import ray
import ray.train
import torch
from ray.train import ScalingConfig

import nbtrain

pytestmark = pytest.mark.quick


def test_unknown_lightning_strategy_names_the_choices():
    from nbtrain._cluster.rank.payload import local_payload
    from nbtrain._cluster.rank.session import TrainingSession, set_session

    set_session(TrainingSession(local_payload("x"), torch.device("cpu")))
    try:
        with pytest.raises(nbtrain.InvalidOptionError, match="'ddp' or 'fsdp'"):
            nbtrain.lightning.trainer(strategy="horovod")
    finally:
        set_session(None)


def test_configs_nbtrain_cannot_honour_are_refused_by_name():
    with pytest.raises(nbtrain.InvalidOptionError, match="special_hardware"):
        nbtrain.TorchTrainer(lambda: None, scaling_config=ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "special_hardware": 1}))
    import pyarrow.fs

    with pytest.raises(nbtrain.InvalidOptionError, match=r"storage_filesystem.*as a URI in storage_path"):
        nbtrain.TorchTrainer(lambda: None, run_config=ray.train.RunConfig(
            storage_path="/tmp/runs", storage_filesystem=pyarrow.fs.LocalFileSystem()))
    for given in ("s3://bucket/runs", "/mnt/shared/runs"):  # a pyarrow.fs URI or a shared directory: storage=
        trainer = nbtrain.TorchTrainer(lambda: None, run_config=ray.train.RunConfig(storage_path=given))
        assert trainer.options["storage"] == given
    trainer = nbtrain.TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=3, use_gpu=True),
                                   run_config=ray.train.RunConfig(
                                       name="x", failure_config=ray.train.FailureConfig(max_failures=-1)),
                                   warm=False)
    assert trainer.options["workers"] == 3 and trainer.options["gpus_per_worker"] == 1.0
    assert trainer.options["name"] == "x" and trainer.options["max_failures"] > 1000
    assert trainer.options["warm"] is False


def test_an_untested_ray_is_refused_with_the_tested_versions():
    from ray.train.v2._internal.execution.train_fn_utils import get_train_fn_utils, set_train_fn_utils

    from nbtrain._cluster.rank.ray_train import seam

    reason = seam.untested_ray("2.40.1")
    assert reason is not None and "2.40.1" in reason and seam.TESTED_RAY_MINORS[-1] in reason
    assert seam.untested_ray(ray.__version__) is None  # the Ray installed here is a tested one
    set_train_fn_utils(seam._RefuseOnUntestedRay(reason))
    try:
        with pytest.raises(nbtrain.NbtrainError, match=r"2\.40\.1"):
            ray.train.report({"loss": 1.0})
    finally:
        set_train_fn_utils(None)
    with pytest.raises(RuntimeError):
        get_train_fn_utils()
