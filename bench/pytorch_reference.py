#!/usr/bin/python3
"""PyTorch reference for the ZeroTrain training benchmarks.

Trains a GPT-2 or Llama decoder on random tokens, the way ZeroTrain's `training_bench` does,
and prints one JSON line of results (tokens/s, median step time, peak and baseline RSS, final
loss; on a GPU also peak device memory, achieved TFLOP/s and MFU). On the CPU it is written
for PyTorch 1.13 as Debian ships it (run it with /usr/bin/python3); on a GPU (--device cuda,
PyTorch 2.x as the GPU machines have it) it is the reference of issue 15: bf16 autocast,
scaled_dot_product_attention (flash), fused AdamW, eager or --compile (torch.compile).

The model mirrors worker/model/param_layout.h so the GEMM shapes are the same on both sides:
one fused qkv projection per block (rows [q | k | v]) and, for Llama, one fused SwiGLU input
projection (rows [gate | up]). Attention is nanoGPT's slow path (explicit masked
softmax(QKᵀ/√D)V) because PyTorch 1.13 has no scaled_dot_product_attention.

Legend: B = batch, T = sequence, C = d_model, H = query heads, Hkv = key/value heads,
D = C/H (head size), F = d_ff, V = vocab, L = layers.
"""

import argparse
import contextlib
import ctypes
import json
import math
import os
import resource
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=["gpt2", "llama"], required=True)
    p.add_argument("--n-layer", type=int, required=True)
    p.add_argument("--n-head", type=int, required=True)
    p.add_argument("--n-kv-head", type=int, default=None,
                   help="key/value heads (default: n-head; gpt2 requires n-head)")
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--d-ff", type=int, default=None,
                   help="MLP width (default: 4*C for gpt2, 8*C/3 rounded up to 64 for llama)")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="rows of the gpt2 position table (default: seq-len)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps before timing")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: autocast to bf16 around the forward (fp32 master weights and "
                        "optimizer), as ZeroTrain's bf16 compute dtype")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2)")
    p.add_argument("--adamw-for-loop", action="store_true",
                   help="CPU: AdamW(foreach=False), the per-tensor loop (less memory, slower)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense peak for --precision, for MFU (default on CUDA: "
                        "989.4, an H100 SXM's bf16 dense peak; 494.7 for tf32)")
    p.add_argument("--omp-wait-policy", choices=["passive", "active", "unset"],
                   default="passive",
                   help="OMP_WAIT_POLICY for torch's OpenMP pool (default passive: with the "
                        "default spinning, idle OpenMP workers steal the cores that "
                        "OpenBLAS's own threads need and torch runs about 2x slower on 2 "
                        "cores); unset leaves the environment as it is")
    tie = p.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None,
                     help="share wte with the head (default for gpt2)")
    tie.add_argument("--untied", dest="tied", action="store_false",
                     help="separate lm_head (default for llama)")
    a = p.parse_args(argv)

    if a.n_kv_head is None:
        a.n_kv_head = a.n_head
    if a.d_ff is None:
        a.d_ff = 4 * a.d_model if a.family == "gpt2" else -(-8 * a.d_model // 3 // 64) * 64
    if a.max_seq_len is None:
        a.max_seq_len = a.seq_len
    if a.tied is None:
        a.tied = a.family == "gpt2"

    positive = ["n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "seq_len", "batch",
                "steps", "threads"]
    for name in positive:
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} is {getattr(a, name)}; it must be >= 1")
    if a.vocab < 2:
        p.error(f"--vocab is {a.vocab}; it must be >= 2")
    if a.warmup_steps < 0:
        p.error(f"--warmup-steps is {a.warmup_steps}; it must be >= 0")
    if a.d_model % a.n_head != 0:
        p.error(f"--n-head {a.n_head} must divide --d-model {a.d_model}")
    if a.n_head % a.n_kv_head != 0:
        p.error(f"--n-kv-head {a.n_kv_head} must divide --n-head {a.n_head}")
    if a.family == "gpt2" and a.n_kv_head != a.n_head:
        p.error(f"--n-kv-head {a.n_kv_head} must equal --n-head {a.n_head} for gpt2")
    if a.max_seq_len < a.seq_len:
        p.error(f"--max-seq-len {a.max_seq_len} must be >= --seq-len {a.seq_len}")
    return a


def current_rss_bytes():
    # VmRSS is the resident set now; ru_maxrss would be the high-water mark since exec.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmRSS line")


def openblas_info():
    # torch's GEMMs go to whichever libblas.so.3 the system selects; when that is OpenBLAS
    # its core type (which OPENBLAS_CORETYPE may force) decides the sgemm speed.
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        return {"corename": lib.openblas_get_corename().decode(),
                "config": lib.openblas_get_config().decode().strip(),
                "threads": lib.openblas_get_num_threads()}
    except (OSError, AttributeError):
        return None


args = parse_args(sys.argv[1:])
# Set before torch loads OpenBLAS/OpenMP: their thread pools read these once at start-up.
os.environ["OMP_NUM_THREADS"] = str(args.threads)
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
if args.omp_wait_policy != "unset":
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BASELINE_RSS_BYTES = current_rss_bytes()
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


class RMSNorm(nn.Module):
    # PyTorch 1.13 has no nn.RMSNorm.
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n_head, self.n_kv_head = a.n_head, a.n_kv_head
        self.head_dim = a.d_model // a.n_head
        bias = a.family == "gpt2"
        q_rows = (a.n_head + 2 * a.n_kv_head) * self.head_dim
        self.qkv = nn.Linear(a.d_model, q_rows, bias=bias)  # (Q, C), rows [q | k | v]
        self.proj = nn.Linear(a.n_head * self.head_dim, a.d_model, bias=bias)
        self.proj.is_residual_projection = True
        # True above the diagonal: the future positions a query must not see. Stored inverted
        # so the step does not negate nanoGPT's tril mask on every call.
        future = torch.triu(torch.ones(a.seq_len, a.seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("future", future.view(1, 1, a.seq_len, a.seq_len), persistent=False)

    def forward(self, x, rope):
        B, T, C = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.qkv(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        if rope is not None:
            cos, sin = rope  # (T, D) each
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if Hkv != H:
            # Query head h reads key/value head h // (H/Hkv), as Hugging Face's repeat_kv.
            rep = H // Hkv
            k = k[:, :, None].expand(B, Hkv, rep, T, D).reshape(B, H, T, D)
            v = v[:, :, None].expand(B, Hkv, rep, T, D).reshape(B, H, T, D)
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # (B, H, T, T)
            att = att.masked_fill(self.future[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, H * D)
        return self.proj(y)


class Mlp(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.gpt2 = a.family == "gpt2"
        # GPT-2: fc (F, C); Llama: fc (2F, C) with rows [gate | up], as the C++ layout.
        self.fc = nn.Linear(a.d_model, a.d_ff if self.gpt2 else 2 * a.d_ff, bias=self.gpt2)
        self.proj = nn.Linear(a.d_ff, a.d_model, bias=self.gpt2)
        self.proj.is_residual_projection = True

    def forward(self, x):
        h = self.fc(x)
        if self.gpt2:
            h = F.gelu(h, approximate="tanh")
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.proj(h)


def make_norm(a):
    eps = 1e-5
    return nn.LayerNorm(a.d_model, eps=eps) if a.family == "gpt2" else RMSNorm(a.d_model, eps)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.ln1, self.attn = make_norm(a), Attention(a)
        self.ln2, self.mlp = make_norm(a), Mlp(a)

    def forward(self, x, rope):
        x = x + self.attn(self.ln1(x), rope)
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.gpt2 = a.family == "gpt2"
        self.wte = nn.Embedding(a.vocab, a.d_model)
        self.wpe = nn.Embedding(a.max_seq_len, a.d_model) if self.gpt2 else None
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.n_layer))
        self.ln_f = make_norm(a)
        self.lm_head = nn.Linear(a.d_model, a.vocab, bias=False)
        if a.tied:
            self.lm_head.weight = self.wte.weight
        if not self.gpt2:
            D = a.d_model // a.n_head
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
            freqs = torch.outer(torch.arange(a.seq_len, dtype=torch.float32), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)  # (T, D), rotate-half pairing
            self.register_buffer("rope_cos", emb.cos(), persistent=False)
            self.register_buffer("rope_sin", emb.sin(), persistent=False)
        self._init_weights(a)

    def _init_weights(self, a):
        # GPT-2 initialisation (nanoGPT): N(0, 0.02), residual projections scaled by
        # 1/sqrt(2L), zero biases, unit norm weights; the C++ engine uses the same scheme.
        std = 0.02
        for m in self.modules():
            if isinstance(m, nn.Linear):
                s = std / math.sqrt(2 * a.n_layer) if getattr(
                    m, "is_residual_projection", False) else std
                nn.init.normal_(m.weight, 0.0, s)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, std)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx)  # (B, T, C)
        rope = None
        if self.gpt2:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        else:
            rope = (self.rope_cos[:T], self.rope_sin[:T])
        for block in self.blocks:
            x = block(x, rope)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def make_optimizer(model, device, for_loop=False):
    # Only linear layers' weight matrices decay (the C++ default, decay_all_parameters
    # false); with tied embeddings the shared matrix is wte, which does not decay.
    decay_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay_ids -= {id(model.wte.weight)}
    params = list(model.parameters())  # unique: a tied matrix appears once
    groups = [
        {"params": [p for p in params if id(p) in decay_ids], "weight_decay": 0.1},
        {"params": [p for p in params if id(p) not in decay_ids], "weight_decay": 0.0},
    ]
    if device == "cuda":
        # The fused CUDA kernel (PyTorch 2.x): one launch for every tensor's update.
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        return opt, "AdamW(fused=True)"
    # PyTorch 1.13's AdamW has no fused kernel (fused arrives in 2.x); foreach batches the
    # update over all tensors, the fastest path it offers, at the cost of two temporaries the
    # size of every parameter (8 bytes a parameter at the step's peak); the per-tensor loop
    # (--adamw-for-loop) needs them only per tensor: the largest model that fits.
    foreach = not for_loop
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)
    return opt, f"AdamW(foreach={foreach})"


def flops_per_token(a, n_params):
    # 6 per parameter per token (forward 2, backward 4), the embedding lookups excluded (they
    # are gathers) but a tied head's matrix included (it is a GEMM), plus attention's QKᵀ and
    # PV: 2·2·T·C per layer forward, ×3 with the backward, counted over the full T×T as
    # PaLM's and nanoGPT's MFU do (a causal kernel does about half of it).
    gemm_params = n_params - a.vocab * a.d_model * (0 if a.tied else 1)
    if a.family == "gpt2":
        gemm_params -= a.max_seq_len * a.d_model
    return 6 * gemm_params + 12 * a.n_layer * a.seq_len * a.d_model


def main():
    a = args
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("pytorch_reference.py: --device cuda but torch.cuda.is_available() is False")
    if cuda:
        # TF32 off, as ZeroTrain's default: fp32 GEMMs stay fp32 (bf16 runs are unaffected).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = Decoder(a).to(a.device)
    model.train()
    opt, opt_desc = make_optimizer(model, a.device, a.adamw_for_loop)
    n_params = sum(p.numel() for p in model.parameters())
    step_model = model
    if a.compile:
        if not hasattr(torch, "compile"):
            sys.exit(f"pytorch_reference.py: --compile needs PyTorch 2 (this is {torch.__version__})")
        step_model = torch.compile(model)
    autocast = (torch.autocast(device_type=a.device, dtype=torch.bfloat16)
                if a.precision == "bf16" else contextlib.nullcontext())

    # All batches are drawn before timing so the sampler is not on the timed path.
    gen = torch.Generator().manual_seed(a.seed)
    total = a.warmup_steps + a.steps
    data = torch.randint(0, a.vocab, (total, a.batch, a.seq_len + 1), generator=gen).to(a.device)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    step_s = []
    loss_value = float("nan")
    for i in range(total):
        x, y = data[i, :, :-1], data[i, :, 1:]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()  # synchronizes: the step's time includes the whole step
        t1 = time.perf_counter()
        if i >= a.warmup_steps:
            step_s.append(t1 - t0)

    elapsed = sum(step_s)
    tokens_per_s = a.batch * a.seq_len * a.steps / elapsed
    peak_tflops = a.peak_tflops
    if peak_tflops is None and cuda:
        peak_tflops = 989.4 if a.precision == "bf16" else 494.7
    achieved_tflops = flops_per_token(a, n_params) * tokens_per_s / 1e12
    result = {
        "impl": "pytorch",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "family": a.family,
        "n_layer": a.n_layer, "n_head": a.n_head, "n_kv_head": a.n_kv_head,
        "d_model": a.d_model, "d_ff": a.d_ff, "vocab": a.vocab, "seq_len": a.seq_len,
        "max_seq_len": a.max_seq_len, "batch": a.batch, "tied": a.tied,
        "steps": a.steps, "warmup_steps": a.warmup_steps,
        "params": n_params,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "precision": a.precision,
        "compiled": a.compile,
        "tokens_per_s": tokens_per_s,
        "achieved_tflops": achieved_tflops,
        "peak_tflops": peak_tflops,
        "mfu": achieved_tflops / peak_tflops if peak_tflops else None,
        "peak_device_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "step_ms": statistics.median(step_s) * 1e3,
        "elapsed_s": elapsed,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "baseline_rss_bytes": BASELINE_RSS_BYTES,
        "final_loss": loss_value,
        "optimizer": opt_desc,
        "attention": ("scaled_dot_product_attention" if HAVE_SDPA
                      else "explicit masked softmax (no SDPA in this torch)"),
        "openblas": openblas_info(),
        "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE"),
        "omp_wait_policy_env": os.environ.get("OMP_WAIT_POLICY"),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
