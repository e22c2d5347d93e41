#!/usr/bin/python3
"""An independent reference for the model's forward: the loss of a Hugging Face-layout
safetensors model (GPT-2 or Llama naming, as `zt train --export` writes) on token batches,
computed in float64 with PyTorch from the published architectures, not from ZeroTrain's code.

usage: hf_model_loss.py CONFIG_JSON WEIGHTS TOKENS_BIN
  CONFIG_JSON: {"family": "GPT2"|"LLAMA", "n_layer", "n_head", "n_kv_head", "d_model",
                "eps", "rope_theta", "batch", "seq_len", "batches"}
  TOKENS_BIN:  a ZeroTrain token shard (docs/formats.md); micro-batch k reads B*T+1 tokens
               from k*B*T (the sequential sampler).
Prints one JSON line: {"losses": [mean loss of each batch]}.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b:base + e]), dtype=dtypes[info["dtype"]])
        out[name] = t.reshape(info["shape"]).to(torch.float64)
    return out


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"ZTTOKENS"
    width, count = struct.unpack("<IQ", data[12:24])
    fmt = {2: "H", 4: "I"}[width]
    return torch.tensor(struct.unpack("<%d%s" % (count, fmt), data[64:64 + count * width]))


def attention(q, k, v):
    # q (B, H, T, D), k/v (B, Hkv, T, D): grouped heads share k/v.
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    T = q.shape[2]
    att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return att @ v


def gpt2_logits(w, cfg, idx):
    B, T = idx.shape
    C, H = cfg["d_model"], cfg["n_head"]
    p = "transformer."
    x = w[p + "wte.weight"][idx] + w[p + "wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        h = p + "h.%d." % i
        a = F.layer_norm(x, (C,), w[h + "ln_1.weight"], w[h + "ln_1.bias"], cfg["eps"])
        qkv = a @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]  # Conv1D [in, out]
        q, k, v = qkv.split(C, dim=-1)
        shape = lambda t: t.view(B, T, H, C // H).transpose(1, 2)
        y = attention(shape(q), shape(k), shape(v)).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), w[h + "ln_2.weight"], w[h + "ln_2.bias"], cfg["eps"])
        m = F.gelu(m @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w[p + "ln_f.weight"], w[p + "ln_f.bias"], cfg["eps"])
    head = w.get("lm_head.weight", w[p + "wte.weight"])
    return x @ head.T


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(t, theta):
    # Hugging Face's rotate-half convention on (B, heads, T, D).
    T, D = t.shape[2], t.shape[3]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    half = torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1)
    return t * cos + half * sin


def llama_logits(w, cfg, idx):
    B, T = idx.shape
    C, H, Hkv = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"]
    D = C // H
    x = w["model.embed_tokens.weight"][idx]
    for i in range(cfg["n_layer"]):
        h = "model.layers.%d." % i
        a = rms_norm(x, w[h + "input_layernorm.weight"], cfg["eps"])
        q = (a @ w[h + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (a @ w[h + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        v = (a @ w[h + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        y = attention(q, k, v).transpose(1, 2).reshape(B, T, H * D)
        x = x + y @ w[h + "self_attn.o_proj.weight"].T
        m = rms_norm(x, w[h + "post_attention_layernorm.weight"], cfg["eps"])
        g = F.silu(m @ w[h + "mlp.gate_proj.weight"].T) * (m @ w[h + "mlp.up_proj.weight"].T)
        x = x + g @ w[h + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], cfg["eps"])
    return x @ w["lm_head.weight"].T


def main():
    cfg = json.load(open(sys.argv[1]))
    w = read_safetensors(sys.argv[2])
    tokens = read_tokens(sys.argv[3]).long()
    B, T = cfg["batch"], cfg["seq_len"]
    losses = []
    for k in range(cfg["batches"]):
        start = (k * B * T) % len(tokens)
        chunk = torch.cat([tokens, tokens])[start:start + B * T + 1]
        idx, tgt = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        logits = gpt2_logits(w, cfg, idx) if cfg["family"] == "GPT2" else llama_logits(w, cfg, idx)
        losses.append(F.cross_entropy(logits.view(B * T, -1), tgt.reshape(-1)).item())
    print(json.dumps({"losses": losses}))


if __name__ == "__main__":
    main()
