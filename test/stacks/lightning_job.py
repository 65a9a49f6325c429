"""A Lightning 2.6 job as its documentation shows it: Trainer(strategy="ddp", accelerator="cpu", devices=2)
with Lightning's own launcher (this script is started once; Lightning starts rank 1 itself).

    lightning_job.py STATE_DIR

Each rank writes STATE_DIR/pid_<rank> after its third step, then trains on (up to 100,000 steps) until
STATE_DIR/stop exists. Lightning installs its SIGTERM handler when fit starts, after the process group exists;
its log lines (INFO, "Received SIGTERM") go to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

state = Path(sys.argv[1])
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")


class Noise(Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(8)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        if self.global_step == 3:
            (state / f"pid_{self.global_rank}").write_text(str(os.getpid()))
        if (state / "stop").exists():
            self.trainer.should_stop = True


trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=100_000, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), DataLoader(Noise(), batch_size=4, num_workers=0))
print(f"DONE {trainer.global_rank}", flush=True)
