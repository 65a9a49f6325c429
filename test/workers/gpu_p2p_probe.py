"""Diagnostic: one unbatched irecv/isend pair between 2 GPUs ranks; argv: BACKEND ORDER (recv_first|send_first)."""
import os, sys, time, torch, torch.distributed as dist
backend = sys.argv[1]; order = sys.argv[2]
lr = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(lr)
kw = {"device_id": torch.device("cuda", lr)} if os.environ.get("BIND") == "1" else {}
dist.init_process_group(backend, **kw)
r = dist.get_rank(); peer = 1 - r
x = torch.ones(4, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
got = torch.zeros(1, device="cuda"); send = torch.full((1,), float(r), device="cuda")
t = time.time()
if order == "recv_first":
    ws = [dist.irecv(got, src=peer), dist.isend(send, dst=peer)]
else:
    ws = [dist.isend(send, dst=peer), dist.irecv(got, src=peer)]
for w in ws: w.wait()
torch.cuda.synchronize()
print(f"RESULT {backend} {order} bind={os.environ.get('BIND')} rank {r} got {got.item()} in {time.time()-t:.2f}s", flush=True)
dist.destroy_process_group()
