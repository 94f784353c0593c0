"""What a torch user runs for the data-parallel optimizer step on CPU, timed the way
BENCHMARKS.md times coconet: P processes on 127.0.0.1 with the gloo backend, N f32
parameters, one step = gradient synchronisation + Adam, medians of interleaved rounds.

    benches/torch_compare.sh            # makes a virtualenv with torch, runs this
    python benches/torch_ddp.py --ranks 4 --log2n 24 --rounds 7

Contenders (every rank holds its own gradient, as in DDP):
- ddp-fused:   all_reduce(g) / P, then torch.optim.Adam(fused=True) on every rank
               (what DDP + a fused optimizer does; coconet's AR-C is its counterpart);
- ddp-foreach: the same with Adam(foreach=True);
- zero1:       reduce_scatter_tensor(g), fused Adam on the rank's shard with its shard
               of m and v, all_gather_into_tensor(w) (coconet's RS-C-AG counterpart);
- ddp-clipped: all_reduce(g) / P, clip_grad_norm_(max_norm=1), AdamW(fused=True,
               weight_decay=0.01) on every rank (the step coconet's data-parallel
               trainer runs as `adamw_clipped`).
Prints one `RESULT` line per contender (median ms) and the phases of ddp-fused.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def adam(params, **kw):
    return torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, **kw)


def worker(local, world, n, rounds, port, out, node_rank=0, local_ranks=None, master="127.0.0.1"):
    # Ranks node_rank * local_ranks + local: this node's share of the world.
    rank = node_rank * (local_ranks or world) + local
    os.environ["MASTER_ADDR"] = master
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    gen = torch.Generator().manual_seed(rank)
    grad = torch.rand(n, generator=gen) - 0.5
    shard = n // world

    w_ddp = {k: torch.zeros(n, requires_grad=True) for k in ("fused", "foreach")}
    opt_ddp = {
        "fused": adam([w_ddp["fused"]], fused=True),
        "foreach": adam([w_ddp["foreach"]], foreach=True),
    }
    w_clip = torch.zeros(n, requires_grad=True)
    opt_clip = torch.optim.AdamW(
        [w_clip], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True
    )
    w_full = torch.zeros(n)
    w_shard = torch.zeros(shard, requires_grad=True)
    opt_zero = adam([w_shard], fused=True)

    def ddp(kind, phases=None):
        g = grad.clone()
        t0 = time.perf_counter()
        dist.all_reduce(g)
        g /= world
        t1 = time.perf_counter()
        w_ddp[kind].grad = g
        opt_ddp[kind].step()
        t2 = time.perf_counter()
        if phases is not None:
            phases.append((t1 - t0, t2 - t1))

    def zero1():
        out_shard = torch.empty(shard)
        dist.reduce_scatter_tensor(out_shard, grad[: shard * world].clone())
        out_shard /= world
        w_shard.grad = out_shard
        opt_zero.step()
        dist.all_gather_into_tensor(w_full[: shard * world], w_shard.detach())

    def clipped():
        g = grad.clone()
        dist.all_reduce(g)
        g /= world
        w_clip.grad = g
        torch.nn.utils.clip_grad_norm_([w_clip], max_norm=1.0)
        opt_clip.step()

    contenders = {
        "ddp-fused": lambda: ddp("fused"),
        "ddp-clipped": clipped,
        "ddp-foreach": lambda: ddp("foreach"),
        "zero1": zero1,
    }
    times = {k: [] for k in contenders}
    phases = []
    unsupported = {}
    for name, f in contenders.items():  # warm-up
        try:
            f()
        except Exception as e:  # e.g. a collective gloo lacks
            unsupported[name] = str(e).splitlines()[0]
    for _ in range(rounds):
        for name, f in contenders.items():
            if name in unsupported:
                continue
            dist.barrier()
            t = time.perf_counter()
            f()
            dist.barrier()
            times[name].append(time.perf_counter() - t)
        dist.barrier()
        ddp("fused", phases)
    if rank == 0:
        with open(out, "w") as fh:
            for name in contenders:
                if name in unsupported:
                    fh.write(f"RESULT torch {name}: unsupported ({unsupported[name]})\n")
                else:
                    ms = statistics.median(times[name]) * 1e3
                    fh.write(f"RESULT torch {name} P={world} N={n}: {ms:.1f} ms\n")
            ar = statistics.median(p[0] for p in phases) * 1e3
            opt = statistics.median(p[1] for p in phases) * 1e3
            fh.write(f"phases ddp-fused: all_reduce {ar:.1f} ms, fused Adam {opt:.1f} ms\n")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--port", type=int, default=29517)
    # Across hosts: the same command on each node with its --node-rank (gloo picks the
    # interface in GLOO_SOCKET_IFNAME); --ranks is the whole world.
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--master", default="127.0.0.1")
    a = ap.parse_args()
    out = f"/tmp/torch_ddp_{os.getpid()}.txt"
    local = a.ranks // a.nodes
    mp.spawn(
        worker,
        args=(a.ranks, 1 << a.log2n, a.rounds, a.port, out, a.node_rank, local, a.master),
        nprocs=local,
    )
    if a.node_rank == 0:
        with open(out) as fh:
            print(fh.read(), end="")
        print(f"torch {torch.__version__}, {a.ranks} processes on {a.nodes} node(s) "
              f"(gloo, master {a.master}), {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
