"""A Hugging Face transformers.Trainer on 2 real nbtrain ranks: a tiny BERT built from a config (no download)."""

from __future__ import annotations

import pytest
import torch
import transformers

import nbtrain


def tiny_bert_config() -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=16, num_labels=2)


class Sentences(torch.utils.data.Dataset):
    """Label 1 when token 7 is in the sentence: learnable by a tiny model."""

    def __init__(self, n: int = 128) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(8, 64, (n, 12), generator=gen)
        self.labels = torch.randint(0, 2, (n,), generator=gen)
        self.ids[self.labels == 1, 3] = 7

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": self.labels[i]}


def test_a_transformers_trainer_streams_every_rank_and_keeps_its_checkpoint(cluster, tmp_path):
    def train(config):
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(tiny_bert_config())
        args = transformers.TrainingArguments(
            output_dir=config["output_dir"], per_device_train_batch_size=8, max_steps=8, logging_steps=1,
            save_steps=8, learning_rate=5e-3, report_to=[], use_cpu=True, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Sentences(),
                                       callbacks=[nbtrain.huggingface.NbtrainCallback()])
        trainer.train()
        return {"world": args.world_size, "checksum": float(sum(p.double().sum() for p in model.parameters()))}

    output_dir = str(tmp_path / "hf")  # each rank's own (same machine here); only rank 0 writes checkpoints
    run = nbtrain.launch(train, config={"output_dir": output_dir}, workers=2, name="hf-trainer")
    assert run.wait(timeout=300) == nbtrain.RunState.SUCCEEDED
    rank0, rank1 = run.result
    assert rank0["world"] == rank1["world"] == 2, "TrainingArguments should see nbtrain's 2 ranks"
    assert rank0["checksum"] == pytest.approx(rank1["checksum"], abs=1e-6), "DDP ranks diverged under the Trainer"
    for rank in (0, 1):
        steps = [r["step"] for r in run.metrics if r["rank"] == rank and "loss" in r]
        assert steps == list(range(1, 9)), f"rank {rank}: one loss row per logged step"
    files = run.checkpoint_dir()
    assert (files / "config.json").exists()
    restored = transformers.BertForSequenceClassification.from_pretrained(files)
    assert float(sum(p.double().sum() for p in restored.parameters())) == pytest.approx(rank0["checksum"], rel=1e-6)


class Slowly(transformers.TrainerCallback):
    """0.1 s per step, so that the notebook has time to steer the run."""

    def on_step_end(self, args, state, control, **kwargs):
        import time

        time.sleep(0.1)


def test_a_transformers_trainer_takes_an_adjust_on_both_ranks(cluster, tmp_path):
    from _helpers import wait_for

    def train(config):
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(tiny_bert_config())
        args = transformers.TrainingArguments(
            output_dir=config["output_dir"], per_device_train_batch_size=8, max_steps=120, logging_steps=1,
            save_strategy="no", learning_rate=5e-3, lr_scheduler_type="constant", report_to=[], use_cpu=True,
            disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Sentences(),
                                       callbacks=[nbtrain.huggingface.NbtrainCallback(), Slowly()])
        trainer.train()
        return float(sum(p.double().sum() for p in model.parameters()))

    run = nbtrain.launch(train, config={"output_dir": str(tmp_path / "hf")}, workers=2, name="hf-steered")
    wait_for(lambda: run.refresh() is not None and len(run.metrics) >= 6, timeout=180, message="logged steps")
    applied = run.adjust(lr=1e-3, wait=True)
    assert run.wait(timeout=300) == nbtrain.RunState.SUCCEEDED
    rank0, rank1 = run.result
    assert rank0 == pytest.approx(rank1, abs=1e-9), "the replicas differ after the change"
    for rank in (0, 1):
        rates = {r["step"]: r["learning_rate"] for r in run.metrics if r["rank"] == rank and "learning_rate" in r}
        assert {round(rate, 9) for step, rate in rates.items() if step > applied} == {1e-3}
        assert {round(rate, 9) for step, rate in rates.items() if step < applied - 1} == {5e-3}
