"""What a torch user runs for `train_gpt_cuda --bench`: the same GPT shape (pre-norm
blocks, causal multi-head attention, a tanh-GELU MLP, a linear head; GPT-2 small's 12
layers, width 768, 12 heads, context 256, batch 8, the sonnets' 53 characters), f32
with TF32 off (candle's default), trained with AdamW(fused=True) on one GPU. Timed the
same way as the Rust example: forward + backward and the optimizer step each between
device synchronisations, medians over the timed steps after 3 warm-up steps.

    python benches/gpt_torch.py [--steps 24] [--sdpa] [--device cpu]

`--sdpa` uses torch's fused attention (what a torch user writes today); without it the
attention is the same explicit matmul / mask / softmax / matmul as the candle model.
Prints `RESULT` lines like the example's.
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads, sdpa):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-5)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, eps=1e-5)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.heads, self.sdpa = heads, sdpa

    def forward(self, x, mask):
        b, t, w = x.shape
        hd = w // self.heads
        q, k, v = (
            z.reshape(b, t, self.heads, hd).transpose(1, 2)
            for z in self.qkv(self.norm1(x)).split(w, dim=2)
        )
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(hd) + mask
            y = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, width, heads, context, vocab, sdpa):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, sdpa) for _ in range(layers))
        self.norm = nn.LayerNorm(width, eps=1e-5)
        self.head = nn.Linear(width, vocab)
        mask = torch.full((context, context), float("-inf")).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.norm(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--sdpa", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu only to try the script")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    layers, width, heads, context, batch, vocab = 12, 768, 12, 256, 8, 53
    torch.manual_seed(1)
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    model = Gpt(layers, width, heads, context, vocab, args.sdpa).to(dev)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01, fused=True)
    count = sum(p.numel() for p in params)
    print(
        f"torch {torch.__version__}: {layers} layers, width {width}, {count} parameters "
        f"in {len(params)} tensors; batch {batch} x {context} tokens, f32"
    )
    fb, op = [], []
    for step in range(args.steps + 3):
        ids = torch.randint(0, vocab, (batch, context + 1), device=dev)
        sync()
        t0 = time.perf_counter()
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        sync()
        t1 = time.perf_counter()
        opt.step()
        sync()
        t2 = time.perf_counter()
        opt.zero_grad()
        if step >= 3:
            fb.append((t1 - t0) * 1e3)
            op.append((t2 - t1) * 1e3)
    f, o = statistics.median(fb), statistics.median(op)
    attention = "fused attention" if args.sdpa else "explicit attention"
    print(
        f"RESULT torch AdamW(fused=True), {attention}: forward+backward {f:.2f} ms, "
        f"optimizer step {o:.3f} ms, step {f + o:.2f} ms, "
        f"{batch * context / (f + o) * 1e3:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
