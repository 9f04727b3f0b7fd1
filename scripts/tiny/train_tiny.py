# Trains a tiny but real (trained) MoE checkpoint in Hugging Face layout, with
# reference outputs computed by transformers, for conformance tests and
# benchmarks of the Go engine.  Runs on the GPU machine (transformers 5.x).
#
#   python3 train_tiny.py --arch qwen3_5_moe --minutes 6 --out $OUT
#   python3 train_tiny.py --arch glm4_moe --minutes 1 --out $OUT --tokenizer tokenizer.json \
#       --experts 32 --corpus-chars 40000000 --bundle
#
# glm4_moe (GLM-4.5) and qwen3_next (Qwen3-Next) were added to the families
# the first four were trained with; --bundle writes one tar.xz of the model
# and its public references (split into 15 MB parts when larger), for a
# machine that returns few files.
#
# testdata/models/tiny-glm4-moe and tiny-qwen3-next came from
#   --arch A --minutes 0.6 --warm 30 --experts 32 --corpus-chars 40000000
#   --tokenizer (the shared models' tokenizer.json) --bundle
# on one H200 with transformers 5.17, both at once (about 3 minutes). What
# that run showed: transformers 5.17 already writes per-expert keys for both;
# its GLM MoE block has no route_tokens_to_experts to wrap, so the GLM model
# trained without the bias balancing (its e_score_correction_bias is zero)
# and its references have no routes; Qwen3-Next's checkpoint read back gave
# logits 0.53 from the bf16 model in memory (over the 0.5 bound), so its
# references come from that model in float32. It holds the exported
# weights exactly, but its rotary inverse frequencies (a buffer, not a
# weight) had been cast to bf16 with it: the tiny-qwen3-next references
# carry that rounding (sluice's TestQwen3NextReferenceRope reproduces it).
# The fallback below now rebuilds the rotary buffers in float32 first; that
# change has not been run.
import argparse, glob, json, math, os, random, sys, time, tarfile, subprocess

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--arch", required=True, choices=["qwen3_5_moe", "qwen3_moe", "deepseek_v32", "gpt_oss", "glm4_moe", "qwen3_next"])
ap.add_argument("--minutes", type=float, default=6.0)
ap.add_argument("--out", required=True)
ap.add_argument("--tokenizer", default=None)
ap.add_argument("--vocab", type=int, default=4096)
ap.add_argument("--dry", action="store_true")
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--warm", type=int, default=100, help="learning-rate warm-up steps")
ap.add_argument("--experts", type=int, default=64, help="routed experts per layer")
ap.add_argument("--corpus-chars", type=int, default=260_000_000)
ap.add_argument("--bundle", action="store_true", help="one tar.xz of model + public refs")
args = ap.parse_args()
t_start = time.time()
torch.manual_seed(0)
random.seed(0)
dev = "cuda"
work = "/tmp/work_" + args.arch
os.makedirs(work, exist_ok=True)
model_dir = os.path.join(work, "tiny-" + args.arch.replace("_", "-"))
os.makedirs(model_dir, exist_ok=True)


def log(*a):
    print(f"[{time.time() - t_start:7.1f}s]", *a, flush=True)


# ---------------------------------------------------------------- corpus
site = "/opt/torch/.venv/lib/python3.12/site-packages"
files = sorted(glob.glob(site + "/**/*.py", recursive=True))
random.Random(1234).shuffle(files)
held, train_files = files[:400], files[400:]


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            t = f.read()
        return t if 200 < len(t) < 300_000 else None
    except Exception:
        return None


texts = []
total = 0
limit = 20_000_000 if args.dry else args.corpus_chars
for f in train_files:
    t = read(f)
    if t:
        texts.append(t)
        total += len(t)
        if total > limit:
            break
held_texts = [t for t in map(read, held) if t]
log("corpus", len(texts), "files", total, "chars; held-out", len(held_texts))

# ---------------------------------------------------------------- tokenizer
from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
if args.tokenizer:
    tok = Tokenizer.from_file(args.tokenizer)
else:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    pat = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab - len(SPECIAL),
        min_frequency=2,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    sample = texts[: max(1, len(texts) // 4)]
    tok.train_from_iterator(sample, trainer)
    tok.add_special_tokens(SPECIAL)
    log("tokenizer trained, vocab", tok.get_vocab_size())
tok.save(os.path.join(model_dir, "tokenizer.json"))
V = tok.get_vocab_size()
assert V <= args.vocab, V
EOT = tok.token_to_id("<|endoftext|>")
IM_END = tok.token_to_id("<|im_end|>")
chat_template = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
json.dump(
    {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "chat_template": chat_template,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
    },
    open(os.path.join(model_dir, "tokenizer_config.json"), "w"),
    indent=2,
)

enc = tok.encode_batch(texts)
ids = []
for e in enc:
    ids.extend(e.ids)
    ids.append(EOT)
data = torch.tensor(ids, dtype=torch.int32)
log("train tokens", data.numel())
del enc, ids

# ---------------------------------------------------------------- model
def build_cfg(cls, kw):
    """The config from keyword arguments; where this transformers refuses
    one, from its defaults with each field set afterwards. Every field that
    did not take is logged."""
    try:
        c = cls(**kw)
    except Exception as e:
        log("config kwargs refused:", repr(e)[:300], "- setting fields one by one")
        c = cls()
        for k, v in kw.items():
            try:
                setattr(c, k, v)
            except Exception as e2:
                log("config field", k, "refused:", repr(e2)[:200])
    for k, v in kw.items():
        if getattr(c, k, None) != v:
            log("config field", k, "is", getattr(c, k, None), "wanted", v)
    return c


from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M35
from transformers.models.qwen3_moe import modeling_qwen3_moe as M3

common = dict(
    vocab_size=V,
    hidden_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    num_experts=args.experts,
    num_experts_per_tok=4,
    moe_intermediate_size=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    output_router_logits=True,
    router_aux_loss_coef=0.01,
    eos_token_id=EOT,
    pad_token_id=EOT,
)
if args.arch == "qwen3_5_moe":
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM

    cfg = Qwen3_5MoeTextConfig(
        **common,
        shared_expert_intermediate_size=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    model = Qwen3_5MoeForCausalLM(cfg)
    MOD = M35
elif args.arch == "deepseek_v32":
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
    import transformers.models.deepseek_v32.modeling_deepseek_v32 as MD

    cfg = DeepseekV32Config(
        vocab_size=V, hidden_size=256, intermediate_size=512, moe_intermediate_size=64,
        num_hidden_layers=6, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=64, routed_scaling_factor=2.5,
        kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32,
        n_group=4, topk_group=2, num_experts_per_tok=4, norm_topk_prob=True,
        index_topk=64, index_head_dim=32, index_n_heads=4,
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=EOT, pad_token_id=EOT, attn_implementation="eager",
    )
    model = DeepseekV32ForCausalLM(cfg)
    MOD = MD
elif args.arch == "gpt_oss":
    from transformers import GptOssConfig, GptOssForCausalLM
    import transformers.models.gpt_oss.modeling_gpt_oss as MG

    cfg = GptOssConfig(
        vocab_size=V, hidden_size=256, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        num_local_experts=64, num_experts_per_tok=4, sliding_window=32,
        layer_types=["sliding_attention", "full_attention"] * 3,
        max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 1024, "truncate": False},
        output_router_logits=True, router_aux_loss_coef=0.01,
        eos_token_id=EOT, pad_token_id=EOT, attn_implementation="eager",
    )
    model = GptOssForCausalLM(cfg)
    MOD = MG
elif args.arch == "glm4_moe":
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    import transformers.models.glm4_moe.modeling_glm4_moe as MGLM

    cfg = build_cfg(
        Glm4MoeConfig,
        dict(
            vocab_size=V, hidden_size=256, intermediate_size=512, moe_intermediate_size=64,
            num_hidden_layers=6, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, attention_bias=True, use_qk_norm=False,
            n_shared_experts=1, n_routed_experts=args.experts, routed_scaling_factor=2.5,
            n_group=1, topk_group=1, num_experts_per_tok=4, norm_topk_prob=True,
            max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            eos_token_id=EOT, pad_token_id=EOT,
        ),
    )
    model = Glm4MoeForCausalLM(cfg)
    MOD = MGLM
elif args.arch == "qwen3_next":
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    import transformers.models.qwen3_next.modeling_qwen3_next as MQN

    cfg = build_cfg(
        Qwen3NextConfig,
        dict(
            **common,
            intermediate_size=512,
            shared_expert_intermediate_size=64,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        ),
    )
    model = Qwen3NextForCausalLM(cfg)
    MOD = MQN
else:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        **common,
        intermediate_size=512,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = Qwen3MoeForCausalLM(cfg)
    MOD = M3

for name in ("grouped_mm", "batched_mm"):
    try:
        model.set_experts_implementation(name)
        log("experts implementation", name)
        break
    except Exception as e:
        log("experts implementation", name, "unavailable:", repr(e)[:200])


class MTP(nn.Module):
    """Qwen3.5 multi-token-prediction head: [norm(embed(t+1)); norm(h_t)] -> fc -> one
    full-attention MoE decoder layer -> norm -> shared lm_head predicts t+2.
    h_t is the trunk's final hidden state after its final norm."""

    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden_size
        full = cfg.layer_types.index("full_attention")
        self.pre_fc_norm_embedding = M35.Qwen3_5MoeRMSNorm(H, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = M35.Qwen3_5MoeRMSNorm(H, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([M35.Qwen3_5MoeDecoderLayer(cfg, layer_idx=full)])
        self.norm = M35.Qwen3_5MoeRMSNorm(H, cfg.rms_norm_eps)

    def forward(self, emb_next, h, pos, rotary):
        z = self.fc(torch.cat([self.pre_fc_norm_embedding(emb_next), self.pre_fc_norm_hidden(h)], -1))
        B, T = pos.shape
        pe = rotary(z, pos.view(1, B, T).expand(3, B, T))
        z = self.layers[0](z, position_embeddings=pe, attention_mask=None, position_ids=pos)
        if isinstance(z, tuple):
            z = z[0]
        return self.norm(z)


mtp = None
if args.arch == "qwen3_5_moe":
    mtp = MTP(cfg)
    for m in mtp.modules():
        model._init_weights(m)
model.to(dev)
if mtp is not None:
    mtp.to(dev)
GATES = []  # (module, last topk indices) for routing capture
if args.arch == "deepseek_v32":
    for mod in model.modules():
        if mod.__class__.__name__ == "DeepseekV32TopkRouter":
            GATES.append(mod)

    def _cap(mod, inp, out):
        mod._last_idx = out[2].detach()

    for g_ in GATES:
        g_.register_forward_hook(_cap)


MOES = []  # glm4_moe: MoE blocks whose routing is recorded
ROUTE_CAPS = None  # a list while routes are being captured
if args.arch == "glm4_moe":

    def _wrap(moe):
        orig = moe.route_tokens_to_experts

        def route(logits):
            idx, w = orig(logits)
            moe._last_idx = idx.detach()
            if ROUTE_CAPS is not None:
                ROUTE_CAPS.append(idx.tolist())
            return idx, w

        moe.route_tokens_to_experts = route

    def _is_moe(mod):
        return hasattr(mod, "route_tokens_to_experts") and hasattr(mod, "gate")

    for mod in model.modules():
        if _is_moe(mod):
            _wrap(mod)
            MOES.append(mod)
    log("glm4_moe MoE blocks", len(MOES))


def balance_step():
    """DeepSeek's aux-loss-free balancing: nudge each gate's correction bias toward equal load."""
    with torch.no_grad():
        for g_ in GATES:
            cnt = torch.bincount(g_._last_idx.flatten(), minlength=g_.num_experts).float()
            g_.e_score_correction_bias += 1e-3 * torch.sign(cnt.mean() - cnt)
        for m_ in MOES:
            if getattr(m_, "_last_idx", None) is None:
                continue
            cnt = torch.bincount(m_._last_idx.flatten(), minlength=m_.gate.weight.shape[0]).float()
            b = m_.gate.e_score_correction_bias
            b += (1e-3 * torch.sign(cnt.mean() - cnt)).to(b.dtype)


params = list(model.parameters()) + (list(mtp.parameters()) if mtp else [])
log("params", sum(p.numel() for p in params))

opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05, fused=True)
B, T = args.batch, args.seq
budget = (0.25 if args.dry else args.minutes) * 60
warm = args.warm
step, est_total = 0, None
t_train = time.time()
hist = []
while True:
    el = time.time() - t_train
    if el > budget:
        break
    if step == 30:
        est_total = int(budget / (el / 30))
        log("estimated steps", est_total)
    tot = est_total or 10**9
    lr = 3e-3 * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / tot))))
    for g in opt.param_groups:
        g["lr"] = lr
    ix = torch.randint(0, data.numel() - T - 2, (B,))
    x = torch.stack([data[i : i + T + 1].long() for i in ix]).to(dev, non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if args.arch in ("deepseek_v32", "glm4_moe"):
            out = model.model(input_ids=x[:, :-1])
        else:
            out = model.model(input_ids=x[:, :-1], output_router_logits=True)
        h = out.last_hidden_state
        logits = model.lm_head(h)
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        aux = torch.zeros((), device=dev)
        rl = getattr(out, "router_logits", None)
        if rl is not None and hasattr(MOD, "load_balancing_loss_func"):
            aux = MOD.load_balancing_loss_func(rl, cfg.num_local_experts if args.arch == "gpt_oss" else cfg.num_experts, cfg.num_experts_per_tok)
        total_loss = loss + getattr(cfg, "router_aux_loss_coef", 0.0) * aux
        lm = torch.zeros((), device=dev)
        if mtp is not None:
            pos = torch.arange(1, T, device=dev)[None].expand(B, -1)
            z = mtp(model.model.embed_tokens(x[:, 1:-1]), h[:, :-1], pos, model.model.rotary_emb)
            ml = model.lm_head(z)
            lm = F.cross_entropy(ml.float().flatten(0, 1), x[:, 2:].flatten())
            total_loss = total_loss + 0.3 * lm
    opt.zero_grad(set_to_none=True)
    total_loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    balance_step()
    if step % 50 == 0:
        log(f"step {step} lr {lr:.2e} loss {loss.item():.3f} mtp {lm.item():.3f} aux {aux.item():.3f}")
        hist.append((step, loss.item(), lm.item()))
    step += 1
log("trained steps", step, "tokens", step * B * T)

# ---------------------------------------------------------------- export
model.eval()
model.to(torch.bfloat16)
if mtp is not None:
    mtp.eval().to(torch.bfloat16)
model.config.output_router_logits = False
model.save_pretrained(model_dir, max_shard_size="12MB")
from safetensors.torch import load_file, save_file

index_path = os.path.join(model_dir, "model.safetensors.index.json")
saved = {}
if os.path.exists(index_path):
    index = json.load(open(index_path))
    shards = sorted(set(index["weight_map"].values()))
else:
    index, shards = None, ["model.safetensors"]
for s in shards:
    saved.update(load_file(os.path.join(model_dir, s)))
fused = any(k.endswith("experts.gate_up_proj") for k in saved)
log("saved keys", len(saved), "fused experts on disk:", fused)
log("bias keys", [k for k in saved if "correction_bias" in k][:3], "sinks", [k for k in saved if "sinks" in k][:2])
for k in list(saved)[:12]:
    log("  ", k, tuple(saved[k].shape), saved[k].dtype)


def per_expert(sd):
    """Rewrite fused expert tensors into the per-expert layout of most hub checkpoints."""
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            I = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                out[f"{p}{e}.up_proj.weight"] = v[e, I:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            p = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    return out


sd = dict(saved)
if mtp is not None:
    for k, v in mtp.state_dict().items():
        sd["mtp." + k] = v.detach().to("cpu", torch.bfloat16).contiguous()
# qwen3_moe hub checkpoints are per-expert; qwen3_5_moe keeps what this transformers writes.
if args.arch in ("qwen3_moe", "glm4_moe", "qwen3_next") and fused:
    sd = per_expert(sd)
for s in shards:
    os.remove(os.path.join(model_dir, s))
if os.path.exists(index_path):
    os.remove(index_path)
# reshard ourselves at ~12 MB
cur, cur_bytes, n_sh, wmap, shard_sets = {}, 0, 0, {}, []
for k in sorted(sd):
    nb = sd[k].numel() * sd[k].element_size()
    if cur and cur_bytes + nb > 12_000_000:
        shard_sets.append(cur)
        cur, cur_bytes = {}, 0
    cur[k] = sd[k]
    cur_bytes += nb
shard_sets.append(cur)
N = len(shard_sets)
for i, part in enumerate(shard_sets):
    name = f"model-{i + 1:05d}-of-{N:05d}.safetensors"
    save_file(part, os.path.join(model_dir, name), metadata={"format": "pt"})
    for k in part:
        wmap[k] = name
json.dump(
    {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in sd.values())}, "weight_map": wmap},
    open(index_path, "w"),
    indent=2,
)
conf = json.load(open(os.path.join(model_dir, "config.json")))
conf.pop("output_router_logits", None)
if mtp is not None:
    conf["mtp_num_hidden_layers"] = 1
    conf["mtp_use_dedicated_embeddings"] = False
conf["torch_dtype"] = "bfloat16"
json.dump(conf, open(os.path.join(model_dir, "config.json"), "w"), indent=2)
json.dump(
    {"eos_token_id": [EOT, IM_END], "pad_token_id": EOT, "do_sample": False},
    open(os.path.join(model_dir, "generation_config.json"), "w"),
    indent=2,
)
log("exported", N, "shards", sorted(os.listdir(model_dir)))

# ---------------------------------------------------------------- references
# Reload from disk in float32 so the references are computed from exactly the
# exported (bf16-rounded) weights.
from transformers import AutoModelForCausalLM



@torch.no_grad()
def probe_logits(m):
    return m(input_ids=torch.tensor([list(range(10, 74))], device=dev)).logits[0].float()


if args.arch in ("glm4_moe", "qwen3_next"):
    # The checkpoint is read back as the hub's would be (per-expert keys);
    # it must give the logits of the model in memory (bf16 there, so within
    # bf16's rounding), else the references come from that model in float32.
    mem_logits = probe_logits(model)
    ref = None
    try:
        disk = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
        d = (probe_logits(disk) - mem_logits).abs().max().item()
        log("reloaded checkpoint against the trained model: max logit difference", d, "(bf16 there)")
        if d < 0.5:
            ref = disk
    except Exception as e:
        log("reload failed:", repr(e)[:300])
    if ref is None:
        log("references come from the trained model in float32")
        ref = model.float().eval()
        # Buffers were cast with the weights: rebuild the rotary tables in
        # float32, as a load from disk computes them.
        ref.model.rotary_emb = type(ref.model.rotary_emb)(ref.config).to(dev)
        for name in ("eager", "batched_mm"):
            try:
                ref.set_experts_implementation(name)
                probe_logits(ref)
                break
            except Exception as e:
                log("experts implementation", name, "in float32:", repr(e)[:200])
    if args.arch == "glm4_moe":
        for mod in ref.modules():
            if _is_moe(mod) and mod not in MOES:
                _wrap(mod)
                MOES.append(mod)
else:
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
mtp_ref = None
rgates = [m for m in ref.modules() if m.__class__.__name__ == "DeepseekV32TopkRouter"]
if mtp is not None:
    mtp_ref = MTP(cfg).to(dev).float().eval()
    msd = {k[4:]: v for k, v in sd.items() if k.startswith("mtp.")}
    if not any(k.endswith("experts.gate_up_proj") for k in msd):
        msd = {k: v for k, v in msd.items()}
    missing = mtp_ref.load_state_dict({k: v.float() for k, v in msd.items()}, strict=False)
    log("mtp reload", missing)


def prompts_from(texts, seed, n, lo, hi):
    rng = random.Random(seed)
    out = []
    for t in texts:
        ids_ = tok.encode(t).ids
        if len(ids_) < hi + 64:
            continue
        L = rng.randint(lo, hi)
        s = rng.randint(0, len(ids_) - L - 1)
        out.append(ids_[s : s + L])
        if len(out) == n:
            break
    return out


@torch.no_grad()
def case(ids_):
    x = torch.tensor([ids_], device=dev)
    o = ref.model(input_ids=x)
    h = o.last_hidden_state
    lg = ref.lm_head(h)[0].float()
    lp = torch.log_softmax(lg, -1)
    top = torch.topk(lp, 5, dim=-1)
    c = {
        "prompt": ids_,
        "argmax": lg.argmax(-1).tolist(),
        "top5_ids": top.indices.tolist(),
        "top5_logprobs": [[round(v, 5) for v in r] for r in top.values.tolist()],
        "last_logits": [round(v, 5) for v in lg[-1].tolist()],
    }
    seq = list(ids_)
    for _ in range(48):  # plain greedy by full recompute: no cache path involved
        nxt = ref(input_ids=torch.tensor([seq], device=dev)).logits[0, -1].float().argmax().item()
        seq.append(nxt)
    c["greedy"] = seq[len(ids_) :]
    if mtp_ref is not None:
        T_ = x.shape[1]
        # MTP row t (t < T-1) pairs h_t with token t+1 and predicts token t+2.
        pos = torch.arange(1, T_, device=dev)[None]
        z = mtp_ref(ref.model.embed_tokens(x[:, 1:]), h[:, :-1], pos, ref.model.rotary_emb)
        c["mtp_argmax"] = ref.lm_head(z)[0].argmax(-1).tolist()
    return c


@torch.no_grad()
def routes(ids_):
    global ROUTE_CAPS
    x = torch.tensor([ids_], device=dev)
    if args.arch == "glm4_moe":
        ROUTE_CAPS = []
        ref.model(input_ids=x)
        caps, ROUTE_CAPS = ROUTE_CAPS, None
        return caps
    if args.arch == "deepseek_v32":
        caps = []
        hs = [g_.register_forward_hook(lambda m, i, o: caps.append(o[2].tolist())) for g_ in rgates]
        ref.model(input_ids=x)
        for h_ in hs:
            h_.remove()
        return caps
    if args.arch == "gpt_oss":
        o = ref.model(input_ids=x, output_router_logits=True)
        return [torch.topk(r.float(), cfg.num_experts_per_tok, -1).indices.tolist() for r in o.router_logits]
    o = ref.model(input_ids=x, output_router_logits=True)
    rl = getattr(o, "router_logits", None)
    if not rl:
        return None
    return [torch.topk(torch.softmax(r.float(), -1), cfg.num_experts_per_tok, -1).indices.tolist() for r in rl]


@torch.no_grad()
def nll(ids_):
    x = torch.tensor([ids_], device=dev)
    lg = ref(input_ids=x).logits[0].float()
    return F.cross_entropy(lg[:-1], x[0, 1:]).item()


pub = prompts_from(held_texts[:200], 7, 12, 16, 200)
priv = prompts_from(held_texts[200:], 11, 12, 16, 300)
long_pub = prompts_from(held_texts[:200], 13, 2, 1500, 2000)
long_priv = prompts_from(held_texts[200:], 17, 2, 1500, 2000)
ppl_ids = []
for t in held_texts[200:260]:
    ppl_ids.extend(tok.encode(t).ids + [EOT])
ppl_ids = ppl_ids[:16384]
chunks = [ppl_ids[i : i + 1024] for i in range(0, len(ppl_ids), 1024)]
ppl_nll = sum(nll(c) * (len(c) - 1) for c in chunks) / sum(len(c) - 1 for c in chunks)

refs_pub = {"arch": args.arch, "cases": [case(p) for p in pub], "long": [case(p) for p in long_pub]}
refs_priv = {
    "arch": args.arch,
    "cases": [case(p) for p in priv],
    "long": [case(p) for p in long_priv],
    "routes_long0": routes(long_priv[0]),
    "heldout_tokens": ppl_ids,
    "heldout_nll_fp32": ppl_nll,
    "train_hist": hist,
    "train_steps": step,
}
refs_pub["routes_long0"] = routes(long_pub[0])
# Tokenizer conformance: raw texts and their ids.
tk = []
for t in held_texts[:40]:
    s = t[:2000]
    tk.append({"text": s, "ids": tok.encode(s).ids})
extra = ["héllo wörld  \t\n\n  x", "日本語のテキスト 123 4567", "<|im_start|>user\nhi<|im_end|>\n", "   leading", "a\r\nb", "emoji 🙂 ok"]
for s in extra:
    tk.append({"text": s, "ids": tok.encode(s).ids})
refs_pub["tokenizer"] = tk[:20]
refs_priv["tokenizer"] = tk[20:]
log("heldout nll fp32", ppl_nll)

json.dump(refs_pub, open(os.path.join(work, "refs-public.json"), "w"))
json.dump(refs_priv, open(os.path.join(work, "refs-private.json"), "w"))
if args.bundle:
    name = os.path.basename(model_dir)
    subprocess.run(
        f"cd {work} && cp refs-public.json {name}.json && tar cf - {name} {name}.json | xz -T16 -6 > {args.out}/{name}.tar.xz"
        f" && cd {args.out} && if [ $(stat -c %s {name}.tar.xz) -gt 15500000 ]; then"
        f" split -b 15000000 -d {name}.tar.xz {name}.tar.xz.part && rm {name}.tar.xz; fi && ls -la {args.out}",
        shell=True,
        check=True,
    )
    log("done")
    sys.exit(0)
subprocess.run(
    f"cd {work} && tar cf - {os.path.basename(model_dir)} | xz -T16 -6 > {args.out}/{os.path.basename(model_dir)}.tar.xz"
    f" && xz -T16 -6 -c refs-public.json > {args.out}/refs-public-{args.arch}.json.xz"
    f" && xz -T16 -6 -c refs-private.json > {args.out}/refs-private-{args.arch}.json.xz"
    f" && cp {model_dir}/tokenizer.json {args.out}/tokenizer.json && ls -la {args.out}",
    shell=True,
    check=True,
)
sz = os.path.getsize(f"{args.out}/{os.path.basename(model_dir)}.tar.xz")
if sz > 15_500_000:
    subprocess.run(
        f"cd {args.out} && split -b 15000000 -d {os.path.basename(model_dir)}.tar.xz {os.path.basename(model_dir)}.tar.xz.part"
        f" && rm {os.path.basename(model_dir)}.tar.xz && ls -la",
        shell=True,
        check=True,
    )
log("done")
