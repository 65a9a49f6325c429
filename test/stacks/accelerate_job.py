"""An Accelerate 1.16 training loop as its documentation writes one, started by torchrun on 2 CPU ranks.

    accelerate_job.py STALL_RANK STEPS OUT_DIR

Each rank trains a small model on its shard of a fixed dataset with `accelerator.backward`, and writes its
losses, one `<step> <loss>` line per step, to OUT_DIR/losses_<rank> once it is done. STALL_RANK (-1: none) sleeps in its data loader at step 3, as a rank with
a stuck loader does, until the process is stopped; the group's timeout is 5 s (InitProcessGroupKwargs).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch.utils.data import DataLoader, TensorDataset

stall_rank, steps, out_dir = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
STALL_STEP = 3
accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=5))])
rank = accelerator.process_index
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))


def load_next_batch(batches, step):
    if rank == stall_rank and step == STALL_STEP:
        time.sleep(600)
    return next(batches)


batches = iter(loader)
losses = []
for step in range(steps):
    x, y = load_next_batch(batches, step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(f"{step} {loss.item():.6f}")
(out_dir / f"losses_{rank}").write_text("\n".join(losses) + "\n")
accelerator.wait_for_everyone()
accelerator.end_training()
print(f"DONE {rank}", flush=True)
