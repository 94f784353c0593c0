"""torch's Adam against Adam in f64 on the data of tests/accuracy.rs (issue 20): two ranks'
gradients summed, w, m and a small v, step 100, lr 1e-3, betas (0.9, 0.999), eps 1e-8.
Prints the largest |w - exact| for torch's fused, foreach and single-tensor Adam.

    benches/torch_compare.sh makes the virtualenv; then
    python benches/adam_accuracy.py
"""

import torch

MASK = (1 << 64) - 1


def uniform(seed, n):
    """examples/programs/data.rs's splitmix64 stream in [-1, 1), as f64."""
    s = (seed * 0x9E3779B97F4A7C15 + 1) & MASK
    out = []
    for _ in range(n):
        s = (s + 0x9E3779B97F4A7C15) & MASK
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        out.append((z >> 11) / float(1 << 52) - 1.0)
    return torch.tensor(out, dtype=torch.float64)


def main():
    n = 1 << 16
    f32 = lambda seed, k: (uniform(seed, n) * k).to(torch.float32)
    g = f32(1, 1e-2) + f32(2, 1e-2)  # the f32 sum, as coconet's all-reduce rounds it
    w, m = f32(3, 1.0), f32(4, 1e-3)
    v = f32(5, 1e-3) * f32(5, 1e-3)
    lr, b1, b2, eps, step = 1e-3, 0.9, 0.999, 1e-8, 100
    gd, md, vd = g.double(), m.double(), v.double()
    m1 = b1 * md + (1 - b1) * gd
    v1 = b2 * vd + (1 - b2) * gd * gd
    exact = w.double() - lr * (m1 / (1 - b1**step)) / ((v1 / (1 - b2**step)).sqrt() + eps)
    for kind in ["fused", "foreach", "single-tensor"]:
        p = torch.nn.Parameter(w.clone())
        kw = {"fused": True} if kind == "fused" else {"foreach": kind == "foreach"}
        opt = torch.optim.Adam([p], lr=lr, betas=(b1, b2), eps=eps, **kw)
        opt.state[p] = {
            "step": torch.tensor(float(step - 1)),
            "exp_avg": m.clone(),
            "exp_avg_sq": v.clone(),
        }
        p.grad = g.clone()
        opt.step()
        err = (p.detach().double() - exact).abs().max().item()
        print(f"RESULT torch {torch.__version__} Adam {kind}: max |w - exact| = {err:.3e}")


if __name__ == "__main__":
    main()
