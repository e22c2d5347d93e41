#!/usr/bin/python3
"""An independent reference for LoRA fine-tuning steps (Hu et al. 2021, as PEFT computes them):
a frozen Hugging Face-layout base plus PEFT-layout adapters, trained with AdamW (decoupled weight
decay, Loshchilov & Hutter) and global-norm gradient clipping, in float64 with PyTorch's autograd,
from the published GPT-2 / Llama architectures (tests/reference/hf_model_loss.py), not from
ZeroTrain's code. `peft` is not packaged for Debian; this is the same arithmetic written out.

usage:
  lora_steps.py make CONFIG_JSON OUT_DIR
      writes OUT_DIR/base.safetensors (random base, F32) and OUT_DIR/adapter/ (PEFT layout:
      adapter_config.json + adapter_model.safetensors, random A and B, both non-zero so that
      every adapter gets a gradient from the first step).
  lora_steps.py train CONFIG_JSON OUT_DIR TOKENS_BIN ZT_ADAPTER_DIR
      runs CONFIG_JSON's "steps" steps from OUT_DIR's base and adapters on TOKENS_BIN (the
      sequential sampler: step k reads B*T+1 tokens from k*B*T) and prints one JSON line:
      {"losses": [loss before each step's update], "max_abs_diff": largest |ours - reference|
       over every adapter element of ZT_ADAPTER_DIR, "max_abs_ref": largest |reference|,
       "max_abs_moved": largest |reference - initial|, "rms_diff" and "rms_moved": the same
       two differences' root mean square over every element, "tensors": count compared}.

CONFIG_JSON: {"family", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "vocab",
              "max_seq_len", "eps", "rope_theta", "batch", "seq_len", "steps", "rank", "alpha",
              "target_modules", "lr", "beta1", "beta2", "adam_eps", "weight_decay",
              "grad_clip", "seed"}
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_model_loss import attention, read_safetensors, read_tokens, rms_norm, rope  # noqa: E402


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


# (module, HF path of its base weight inside a block, in features, out features) per family.
def targets(cfg):
    C, F_ = cfg["d_model"], cfg["d_ff"]
    if cfg["family"] == "GPT2":
        return [("c_attn", "attn.c_attn", C, 3 * C), ("c_proj", "attn.c_proj", C, C),
                ("c_fc", "mlp.c_fc", C, F_), ("c_proj", "mlp.c_proj", F_, C)]
    D = C // cfg["n_head"]
    kv = cfg["n_kv_head"] * D
    return [("q_proj", "self_attn.q_proj", C, C), ("k_proj", "self_attn.k_proj", C, kv),
            ("v_proj", "self_attn.v_proj", C, kv), ("o_proj", "self_attn.o_proj", C, C),
            ("gate_proj", "mlp.gate_proj", C, F_), ("up_proj", "mlp.up_proj", C, F_),
            ("down_proj", "mlp.down_proj", F_, C)]


def block_prefix(cfg, i):
    return ("transformer.h.%d." if cfg["family"] == "GPT2" else "model.layers.%d.") % i


def peft_name(cfg, i, path, ab):
    inner = "transformer.h" if cfg["family"] == "GPT2" else "model.layers"
    return "base_model.model.%s.%d.%s.lora_%s.weight" % (inner, i, path, ab)


def make(cfg, out):
    g = torch.Generator().manual_seed(cfg["seed"])
    C, F_, V, L = cfg["d_model"], cfg["d_ff"], cfg["vocab"], cfg["n_layer"]
    rnd = lambda *shape: (torch.randn(*shape, generator=g, dtype=torch.float64) * 0.2)
    one = lambda n: 1.0 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    w = {}
    if cfg["family"] == "GPT2":
        w["transformer.wte.weight"] = rnd(V, C)
        w["transformer.wpe.weight"] = rnd(cfg["max_seq_len"], C)
        for i in range(L):
            h = block_prefix(cfg, i)
            for ln in ("ln_1", "ln_2"):
                w[h + ln + ".weight"], w[h + ln + ".bias"] = one(C), rnd(C)
            for _, path, fin, fout in targets(cfg):
                w[h + path + ".weight"], w[h + path + ".bias"] = rnd(fin, fout), rnd(fout)
        w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = one(C), rnd(C)
    else:
        w["model.embed_tokens.weight"] = rnd(V, C)
        for i in range(L):
            h = block_prefix(cfg, i)
            w[h + "input_layernorm.weight"] = one(C)
            w[h + "post_attention_layernorm.weight"] = one(C)
            for _, path, fin, fout in targets(cfg):
                w[h + path + ".weight"] = rnd(fout, fin)
        w["model.norm.weight"] = one(C)
        w["lm_head.weight"] = rnd(V, C)
    write_safetensors(os.path.join(out, "base.safetensors"), w)
    adapters = {}
    r = cfg["rank"]
    for i in range(L):
        for module, path, fin, fout in targets(cfg):
            if module in cfg["target_modules"]:
                adapters[peft_name(cfg, i, path, "A")] = rnd(r, fin)
                adapters[peft_name(cfg, i, path, "B")] = rnd(fout, r)
    os.makedirs(os.path.join(out, "adapter"), exist_ok=True)
    write_safetensors(os.path.join(out, "adapter", "adapter_model.safetensors"), adapters)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": cfg["alpha"],
              "lora_dropout": 0.0, "target_modules": cfg["target_modules"], "bias": "none",
              "fan_in_fan_out": cfg["family"] == "GPT2", "base_model_name_or_path": None,
              "inference_mode": True}
    with open(os.path.join(out, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f)


def linear(cfg, w, ad, i, module_path, x):
    """The base layer plus its adapter, scale·(x Aᵀ) Bᵀ, as PEFT's lora.Linear computes it."""
    h = block_prefix(cfg, i)
    if cfg["family"] == "GPT2":  # Conv1D: weight [in, out]
        y = x @ w[h + module_path + ".weight"] + w[h + module_path + ".bias"]
    else:
        y = x @ w[h + module_path + ".weight"].T
    a = ad.get(peft_name(cfg, i, module_path, "A"))
    if a is not None:
        b = ad[peft_name(cfg, i, module_path, "B")]
        y = y + (x @ a.T) @ b.T * (cfg["alpha"] / cfg["rank"])
    return y


def logits(cfg, w, ad, idx):
    B, T = idx.shape
    C, H = cfg["d_model"], cfg["n_head"]
    eps = cfg["eps"]
    if cfg["family"] == "GPT2":
        p = "transformer."
        x = w[p + "wte.weight"][idx] + w[p + "wpe.weight"][:T]
        for i in range(cfg["n_layer"]):
            h = block_prefix(cfg, i)
            a = F.layer_norm(x, (C,), w[h + "ln_1.weight"], w[h + "ln_1.bias"], eps)
            q, k, v = linear(cfg, w, ad, i, "attn.c_attn", a).split(C, dim=-1)
            shape = lambda t: t.view(B, T, H, C // H).transpose(1, 2)
            y = attention(shape(q), shape(k), shape(v)).transpose(1, 2).reshape(B, T, C)
            x = x + linear(cfg, w, ad, i, "attn.c_proj", y)
            m = F.layer_norm(x, (C,), w[h + "ln_2.weight"], w[h + "ln_2.bias"], eps)
            m = F.gelu(linear(cfg, w, ad, i, "mlp.c_fc", m), approximate="tanh")
            x = x + linear(cfg, w, ad, i, "mlp.c_proj", m)
        x = F.layer_norm(x, (C,), w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
        return x @ w[p + "wte.weight"].T
    Hkv = cfg["n_kv_head"]
    D = C // H
    x = w["model.embed_tokens.weight"][idx]
    for i in range(cfg["n_layer"]):
        h = block_prefix(cfg, i)
        a = rms_norm(x, w[h + "input_layernorm.weight"], eps)
        q = linear(cfg, w, ad, i, "self_attn.q_proj", a).view(B, T, H, D).transpose(1, 2)
        k = linear(cfg, w, ad, i, "self_attn.k_proj", a).view(B, T, Hkv, D).transpose(1, 2)
        v = linear(cfg, w, ad, i, "self_attn.v_proj", a).view(B, T, Hkv, D).transpose(1, 2)
        q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        y = attention(q, k, v).transpose(1, 2).reshape(B, T, H * D)
        x = x + linear(cfg, w, ad, i, "self_attn.o_proj", y)
        m = rms_norm(x, w[h + "post_attention_layernorm.weight"], eps)
        g = F.silu(linear(cfg, w, ad, i, "mlp.gate_proj", m)) * linear(cfg, w, ad, i, "mlp.up_proj", m)
        x = x + linear(cfg, w, ad, i, "mlp.down_proj", g)
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T


def train(cfg, out, tokens_path, ours_dir):
    w = read_safetensors(os.path.join(out, "base.safetensors"))
    initial = read_safetensors(os.path.join(out, "adapter", "adapter_model.safetensors"))
    ad = {n: t.clone().requires_grad_(True) for n, t in initial.items()}
    names = sorted(ad)
    m = {n: torch.zeros_like(ad[n]) for n in names}
    v = {n: torch.zeros_like(ad[n]) for n in names}
    tokens = read_tokens(tokens_path).long()
    B, T = cfg["batch"], cfg["seq_len"]
    lr, b1, b2, eps = cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["adam_eps"]
    losses = []
    for step in range(1, cfg["steps"] + 1):
        start = ((step - 1) * B * T) % len(tokens)
        chunk = torch.cat([tokens, tokens])[start:start + B * T + 1]
        idx, tgt = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        loss = F.cross_entropy(logits(cfg, w, ad, idx).view(B * T, -1), tgt.reshape(-1))
        losses.append(loss.item())
        grads = torch.autograd.grad(loss, [ad[n] for n in names])
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        clip = min(1.0, cfg["grad_clip"] / norm) if cfg["grad_clip"] > 0 else 1.0
        with torch.no_grad():
            for n, g in zip(names, grads):
                g = g * clip
                p = ad[n]
                p.mul_(1.0 - lr * cfg["weight_decay"])
                m[n].mul_(b1).add_(g, alpha=1.0 - b1)
                v[n].mul_(b2).addcmul_(g, g, value=1.0 - b2)
                mhat = m[n] / (1.0 - b1 ** step)
                vhat = v[n] / (1.0 - b2 ** step)
                p.sub_(lr * mhat / (vhat.sqrt() + eps))
    ours = read_safetensors(os.path.join(ours_dir, "adapter_model.safetensors"))
    assert sorted(ours) == names, "adapter names differ: %s vs %s" % (sorted(ours), names)
    diff = max(float((ours[n] - ad[n]).abs().max()) for n in names)
    ref = max(float(ad[n].abs().max()) for n in names)
    moved = max(float((ad[n] - initial[n]).abs().max()) for n in names)
    count = sum(ad[n].numel() for n in names)
    rms = lambda sq: math.sqrt(sq / count)
    rms_diff = rms(sum(float(((ours[n] - ad[n]) ** 2).sum()) for n in names))
    rms_moved = rms(sum(float(((ad[n] - initial[n]) ** 2).sum()) for n in names))
    print(json.dumps({"losses": losses, "max_abs_diff": diff, "max_abs_ref": ref,
                      "max_abs_moved": moved, "rms_diff": rms_diff, "rms_moved": rms_moved,
                      "tensors": len(names)}))


def main():
    cfg = json.load(open(sys.argv[2]))
    if sys.argv[1] == "make":
        make(cfg, sys.argv[3])
    else:
        train(cfg, sys.argv[3], sys.argv[4], sys.argv[5])


if __name__ == "__main__":
    main()
