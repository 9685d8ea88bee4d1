#!/usr/bin/env python3
"""PyTorch training the model of an `xfmr train` translation run on the same batches in the same
order, for time-to-quality comparisons (issue 41's time to test BLEU 40, issue 44's side by
side): the peer of `xfmr train`, one script away.

It reads the xfmr run directory's `train-config.json` (model widths, dropout, label smoothing,
batch size, schedule, Adam, seed, checkpoint averaging) and `tokenizer.json` (the same BPE
vocabulary and special ids), and the corpus directory's `train.tsv`, `valid.tsv` and `test.tsv`:

    xfmr train --minutes 10 --out runs/es-en-10
    python3 benches/torch_translate.py --run runs/es-en-10 --data crates/xfmr-cli/data/es-en \\
        --device cpu --minutes 10

What is the same as xfmr's run: the pairs (at most `--max-len` tokens a side; validation and
test pairs all), the framing (source `ids + [eos]`, decoder input `[bos] + ids`, output
`ids + [eos]`), the token-count batches (`xfmr_train::data::token_batches`, ported) and their
seeded order in each epoch (`shuffled`, bit for bit), the paper's model (post-norm layers
without a final norm, shared and tied embeddings scaled by √d_model, sinusoidal positions,
dropout on the embeddings, the sub-layers, the attention weights and inside the feed-forward as
the config says), xfmr's label-smoothed loss (ε on the tokens that are neither the target nor
padding, padding out of the mean), the Noam schedule (§5.3), Adam (β, ε), the budget as
`xfmr train --minutes` counts it (wall-clock from the first step, the validation every
`eval_every` steps and the checkpoints inside it), the validation loss on the whole validation
split, the average of the last `average` checkpoints (every `checkpoint_every` steps) as the
final model, beam search's length penalty chosen among xfmr's `LENGTH_PENALTIES` on the first
500 validation pairs (the highest BLEU, the first on ties), and the test decoding (greedy, and
xfmr's beam search: beam 4, the 2k best continuations of every beam, fairseq's early stop, the
GNMT penalty; at most 128 tokens; with cached keys and values, checked against the full
decoder before training) scored with sacreBLEU (BLEU and chrF). What differs: a stack's layers
start as copies of one under the default `--init pytorch` (`--init xfmr` draws each on its
own; the distributions are the same since 2026-11-29) and random streams, batches padded to their longest sequence (not xfmr's GPU
length ladder), and one process with `--threads` threads where xfmr on a CPU trains one
replica per core (the same step). Every line printed is JSON; the last has `"final": true`.
`benches/side_by_side.py` runs this script and `xfmr train` for the same minutes, one after
the other.
"""
import argparse
import copy
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import model_positions, shuffled, token_batches  # noqa: E402  (ported)


def read_pairs(path, tok, max_len=None):
    pairs, refs = [], []
    # As `xfmr_translate::data` reads a TSV: a BOM skipped, blank lines skipped, sides trimmed.
    with open(path, encoding="utf-8-sig") as f:
        for line in f:
            if not line.strip():
                continue
            src, tgt = (side.strip() for side in line.rstrip("\r\n").split("\t", 1))
            s = tok.encode(src, add_special_tokens=False).ids
            t = tok.encode(tgt, add_special_tokens=False).ids
            if max_len is None or (len(s) <= max_len and len(t) <= max_len):
                pairs.append((s, t))
                refs.append(tgt)
    return pairs, refs


def xfmr_init(torch, model):
    """Redraws the layers' weights as xfmr draws them (`xfmr-attention/src/mha.rs`,
    `xfmr-blocks/src/ffn.rs`, since 2026-11-29 PyTorch's own distributions): q, k, v as one
    packed Xavier-uniform `[3d, d]` matrix with zero biases, the attention's output and both
    feed-forward linears as `nn.Linear` draws them (the output's bias zero), every layer drawn
    on its own (PyTorch's stacks start as copies of one layer)."""
    nn = torch.nn
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.MultiheadAttention):
                nn.init.xavier_uniform_(module.in_proj_weight)
                module.out_proj.reset_parameters()
                for bias in (module.in_proj_bias, module.out_proj.bias):
                    if bias is not None:
                        bias.zero_()
            elif isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
                module.linear1.reset_parameters()
                module.linear2.reset_parameters()


def build_model(torch, cfg, device):
    nn = torch.nn
    m, layer = cfg["model"], cfg["model"]["layer"]
    if layer["norm_position"] != "Post" or model_positions(m) != "Sinusoidal" \
            or not m["share_embeddings"] or not m["tie_output"] or layer.get("n_kv_heads"):
        sys.exit("torch_translate.py ports the paper's model only: post-norm, sinusoidal "
                 "positions, shared and tied embeddings, no grouped heads")
    d, vocab = layer["d_model"], m["src_vocab_size"]
    act = {"Relu": "relu", "Gelu": "gelu"}[layer["activation"]]
    # One dropout rate per nn layer: PyTorch's layers take one for the sub-layer outputs, the
    # attention weights and the feed-forward's inside alike.
    drop = layer["dropout"]
    if layer["attention_dropout"] != drop or layer["ffn_dropout"] != drop:
        print(json.dumps({"note": "attention/ffn dropout differ from dropout; PyTorch uses "
                                  f"{drop} for all"}), flush=True)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d, padding_idx=m["pad_id"])
            enc = nn.TransformerEncoderLayer(d, layer["n_heads"], layer["d_ff"], drop, act,
                                             layer["norm_eps"], batch_first=True,
                                             bias=layer["bias"])
            dec = nn.TransformerDecoderLayer(d, layer["n_heads"], layer["d_ff"], drop, act,
                                             layer["norm_eps"], batch_first=True,
                                             bias=layer["bias"])
            self.encoder = nn.TransformerEncoder(enc, m["n_encoder_layers"],
                                                 enable_nested_tensor=False)
            self.decoder = nn.TransformerDecoder(dec, m["n_decoder_layers"])
            self.drop = nn.Dropout(drop)
            pos = torch.arange(m["max_len"]).unsqueeze(1)
            div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
            table = torch.zeros(m["max_len"], d)
            table[:, 0::2], table[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
            self.register_buffer("table", table)
            nn.init.normal_(self.embed.weight, std=d ** -0.5)

        def inputs(self, ids):
            return self.drop(self.embed(ids) * math.sqrt(d) + self.table[: ids.shape[1]])

        def encode(self, src):
            pad = src == m["pad_id"]
            return self.encoder(self.inputs(src), src_key_padding_mask=pad), pad

        def decode(self, memory, src_pad, tgt_in):
            n = tgt_in.shape[1]
            causal = torch.ones(n, n, dtype=torch.bool, device=tgt_in.device).triu(1)
            h = self.decoder(self.inputs(tgt_in), memory, tgt_mask=causal, tgt_is_causal=True,
                             tgt_key_padding_mask=tgt_in == m["pad_id"],
                             memory_key_padding_mask=src_pad)
            return h @ self.embed.weight.T

        def forward(self, src, tgt_in):
            memory, src_pad = self.encode(src)
            return self.decode(memory, src_pad, tgt_in)

    return Model().to(device)


def smoothed_loss(torch, logits, targets, pad, epsilon):
    """xfmr's label-smoothed cross-entropy (`xfmr_models::LabelSmoothedCrossEntropy`, its
    default `SmoothingMass::NonPadding`): `1 - ε` on the target and `ε / (V - 2)` on every
    token that is neither the target nor padding; padding positions out of the mean. Returns
    the loss, the mean negative log-likelihood and the count of predicted tokens."""
    vocab = logits.shape[-1]
    logp = torch.log_softmax(logits.reshape(-1, vocab).float(), -1)
    y = targets.reshape(-1)
    real = y != pad
    logp, y = logp[real], y[real]
    nll = -logp.gather(1, y[:, None])[:, 0]
    others = -logp.sum(-1) - nll + logp[:, pad]
    loss = (1.0 - epsilon) * nll + epsilon / (vocab - 2) * others
    return loss.mean(), nll.mean().detach(), int(real.sum())


class CachedDecoder:
    """Step-by-step decoding of the model's post-norm decoder, as xfmr decodes: each layer's
    self-attention keys and values cached, the cross-attention's keys and values of the memory
    computed once; rows reorderable (beam search). Dropout off (call in `eval` mode)."""

    def __init__(self, torch, model, memory, src_pad):
        self.torch, self.model, self.F = torch, model, torch.nn.functional
        self.layers = list(model.decoder.layers)
        self.heads = self.layers[0].self_attn.num_heads
        self.d = memory.shape[-1]
        d = self.d
        self.cross = []
        for layer in self.layers:
            w, b = layer.multihead_attn.in_proj_weight, layer.multihead_attn.in_proj_bias
            k = self.F.linear(memory, w[d:2 * d], None if b is None else b[d:2 * d])
            v = self.F.linear(memory, w[2 * d:], None if b is None else b[2 * d:])
            self.cross.append((self.split(k), self.split(v)))
        self.keep = ~src_pad[:, None, None, :]
        self.cache = [None] * len(self.layers)
        self.t = 0

    def split(self, x):
        rows, length, _ = x.shape
        return x.reshape(rows, length, self.heads, -1).transpose(1, 2)

    def merge(self, x):
        rows, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(rows, length, self.d)

    def step(self, tokens):
        """Logits `[rows, vocab]` of the next token after `tokens` `[rows]`."""
        F, sdpa = self.F, self.F.scaled_dot_product_attention
        x = self.model.embed(tokens[:, None]) * math.sqrt(self.d) \
            + self.model.table[self.t:self.t + 1]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, -1)
            q, k, v = self.split(q), self.split(k), self.split(v)
            if self.cache[i] is not None:
                k = self.torch.cat([self.cache[i][0], k], 2)
                v = self.torch.cat([self.cache[i][1], v], 2)
            self.cache[i] = (k, v)
            x = layer.norm1(x + attn.out_proj(self.merge(sdpa(q, k, v))))
            cross = layer.multihead_attn
            w, b = cross.in_proj_weight, cross.in_proj_bias
            q = self.split(F.linear(x, w[:self.d], None if b is None else b[:self.d]))
            a = sdpa(q, *self.cross[i], attn_mask=self.keep)
            x = layer.norm2(x + cross.out_proj(self.merge(a)))
            x = layer.norm3(x + layer.linear2(layer.activation(layer.linear1(x))))
        self.t += 1
        return x[:, 0] @ self.model.embed.weight.T

    def reorder(self, index):
        self.cache = [(k[index], v[index]) for k, v in self.cache]
        self.cross = [(k[index], v[index]) for k, v in self.cross]
        self.keep = self.keep[index]


def check_cached_decoding(torch, model, pairs, ids, device):
    """The cached decoder's logits equal the full decoder's (recomputed over the whole prefix)
    on a few pairs, teacher-forced: the decoding this script scores is the model trained."""
    pad, bos, eos = ids
    model.eval()
    rows = pairs[:4]
    with torch.inference_mode():
        width = max(len(s) + 1 for s, _ in rows)
        src = torch.tensor([s + [eos] + [pad] * (width - len(s) - 1) for s, _ in rows],
                           device=device)
        memory, src_pad = model.encode(src)
        decoder = CachedDecoder(torch, model, memory, src_pad)
        steps = min(len(t) for _, t in rows) + 1
        tgt = torch.tensor([[bos] + t[:steps - 1] for _, t in rows], device=device)
        full = model.decode(memory, src_pad, tgt)
        worst = max(float((decoder.step(tgt[:, i]) - full[:, i]).abs().max())
                    for i in range(steps))
    model.train()
    if worst > 1e-3:
        sys.exit(f"cached decoding differs from the full decoder by {worst}")
    return worst


def length_penalty(length, alpha):
    """GNMT's `((5 + len) / 6)^α`, as `xfmr_models::generate::length_penalty`."""
    return ((5.0 + length) / 6.0) ** alpha


def translate(torch, model, tok, sources, ids, device, beam=1, alpha=0.6, batch=64):
    """Translations of `sources` (token ids) by greedy search (`beam` 1) or by
    `xfmr_models`'s beam search (the 2k best continuations of every beam, an end counted only
    among the k best, fairseq's early stop once k hypotheses ended, the GNMT penalty on the
    final scores; live beams compete when too few ended), at most `MAX_TOKENS` tokens, in
    batches of sources of similar length."""
    pad, bos, eos = ids
    model.eval()
    out = [None] * len(sources)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    with torch.inference_mode():
        for start in range(0, len(order), batch):
            chunk = order[start:start + batch]
            rows = [sources[i] + [eos] for i in chunk]
            width = max(map(len, rows))
            src = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
            memory, src_pad = model.encode(src)
            if beam == 1:
                texts = greedy_rows(torch, model, memory, src_pad, ids, device)
            else:
                texts = beam_rows(torch, model, memory, src_pad, ids, device, beam, alpha)
            for i, row in zip(chunk, texts):
                out[i] = tok.decode(row)
    model.train()
    return out


MAX_TOKENS = 128  # xfmr-cli's MAX_TRANSLATION_TOKENS


def greedy_rows(torch, model, memory, src_pad, ids, device):
    pad, bos, eos = ids
    rows = memory.shape[0]
    decoder = CachedDecoder(torch, model, memory, src_pad)
    tokens = torch.full((rows,), bos, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    out = []
    for _ in range(MAX_TOKENS):
        tokens = decoder.step(tokens).argmax(-1)
        tokens = torch.where(done, torch.full_like(tokens, pad), tokens)
        out.append(tokens)
        done |= tokens == eos
        if bool(done.all()):
            break
    result = []
    for row in torch.stack(out, 1).tolist():
        row = row[:row.index(eos)] if eos in row else row
        result.append([t for t in row if t != pad])
    return result


def beam_rows(torch, model, memory, src_pad, ids, device, k, alpha):
    pad, bos, eos = ids
    batch = memory.shape[0]
    expand = torch.arange(batch * k, device=device) // k
    decoder = CachedDecoder(torch, model, memory[expand], src_pad[expand])
    inf = float("-inf")
    beams = [[([], 0.0 if j == 0 else inf) for j in range(k)] for _ in range(batch)]
    finished = [[] for _ in range(batch)]
    done = [False] * batch
    tokens = torch.full((batch * k,), bos, device=device)
    for t in range(MAX_TOKENS):
        logp = torch.log_softmax(decoder.step(tokens).float(), -1)
        values, indices = logp.topk(2 * k, -1)
        values, indices = values.tolist(), indices.tolist()
        reorder, nxt = list(range(batch * k)), [pad] * (batch * k)
        for b in range(batch):
            if done[b]:
                continue
            candidates = []
            for j, (_, score) in enumerate(beams[b]):
                if score == inf:
                    continue
                for v, token in zip(values[b * k + j], indices[b * k + j]):
                    candidates.append((score + v, j, token))
            candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
            alive = []
            for rank, (score, j, token) in enumerate(candidates):
                if len(alive) == k:
                    break
                parent = beams[b][j][0]
                if token == eos:
                    if rank < k:
                        finished[b].append((score / length_penalty(t + 1, alpha), parent))
                    continue
                reorder[b * k + len(alive)] = b * k + j
                nxt[b * k + len(alive)] = token
                alive.append((parent + [token], score))
            while len(alive) < k:
                reorder[b * k + len(alive)] = b * k
                alive.append(([], inf))
            beams[b] = alive
            if len(finished[b]) >= k:
                done[b] = True
        if all(done):
            break
        decoder.reorder(torch.tensor(reorder, device=device))
        tokens = torch.tensor(nxt, device=device)
    result = []
    for b in range(batch):
        hyps = finished[b] or [(score / length_penalty(len(toks), alpha), toks)
                               for toks, score in beams[b] if score > inf]
        result.append(max(hyps, key=lambda h: h[0])[1] if hyps else [])
    return result


def scores(hyps, refs):
    import sacrebleu
    return sacrebleu.corpus_bleu(hyps, [refs]).score, sacrebleu.corpus_chrf(hyps, [refs]).score


LENGTH_PENALTIES = [0.6, 1.0, 1.5, 2.0]  # xfmr_translate::translate::LENGTH_PENALTIES


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="the xfmr run directory (config, tokenizer)")
    p.add_argument("--data", required=True, help="train.tsv, valid.tsv, test.tsv")
    p.add_argument("--device", default="cpu")
    p.add_argument("--minutes", type=float,
                   help="wall-clock budget (default: the run's; 0: none, --steps decides)")
    p.add_argument("--steps", type=int, help="step budget (default: the run's)")
    p.add_argument("--max-len", type=int, default=100, help="as `xfmr train --max-len`")
    p.add_argument("--beam", type=int, default=4, help="as `xfmr train --beam`")
    p.add_argument("--bleu-every", type=int, default=0,
                   help="greedy test BLEU every this many steps (outside the budget)")
    p.add_argument("--test-sentences", type=int, default=500)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--init", choices=["pytorch", "xfmr"], default="pytorch",
                   help="the layers' initialisation: PyTorch's own (default; a stack's "
                        "layers start as copies of one) or xfmr's (the same distributions "
                        "since 2026-11-29, every layer drawn on its own)")
    p.add_argument("--out", help="write the final model's test translations (beam) here")
    args = p.parse_args()
    import torch
    from tokenizers import Tokenizer
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.run, "train-config.json")) as f:
        spec = json.load(f)
    if spec.get("task") != "translation":
        sys.exit(f"{args.run}: not a translation run")
    cfg, train = spec["objective"], spec["train"]
    if train.get("decay") or train.get("accumulate", 1) != 1 or train.get("ladder"):
        sys.exit("torch_translate.py ports the paper's schedule without decay, accumulation "
                 "or a length ladder")
    torch.manual_seed(train["seed"])
    tok = Tokenizer.from_file(os.path.join(args.run, "tokenizer.json"))
    ids = pad, bos, eos = cfg["model"]["pad_id"], cfg["bos_id"], cfg["eos_id"]
    pairs, _ = read_pairs(os.path.join(args.data, "train.tsv"), tok, args.max_len)
    valid, valid_refs = read_pairs(os.path.join(args.data, "valid.tsv"), tok)
    test, refs = read_pairs(os.path.join(args.data, "test.tsv"), tok)
    test, refs = test[:args.test_sentences], refs[:args.test_sentences]
    lengths = lambda ps: [(len(s) + 1, len(t) + 1) for s, t in ps]  # noqa: E731
    batches = token_batches(lengths(pairs), train["max_tokens"])
    valid_batches = token_batches(lengths(valid), train["max_tokens"])
    device = torch.device(args.device)
    model = build_model(torch, cfg, device)
    if args.init == "xfmr":
        xfmr_init(torch, model)
    d = cfg["model"]["layer"]["d_model"]
    optim = torch.optim.Adam(model.parameters(), lr=1.0,
                             betas=(train["beta_1"], train["beta_2"]), eps=train["epsilon"])
    factor, warmup = train["lr_factor"], train["warmup"]
    minutes = args.minutes if args.minutes is not None else train.get("minutes")
    minutes = minutes or None  # 0: no time budget, as `xfmr train --minutes 0`
    steps = args.steps or min(train["steps"], 10 ** 9)
    smoothing = cfg["label_smoothing"]

    def tensor(rows):
        width = max(map(len, rows))
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)

    def tensors(rows):
        return (tensor([s + [eos] for s, _ in rows]), tensor([[bos] + t for _, t in rows]),
                tensor([t + [eos] for _, t in rows]))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def validate():
        """xfmr's validation: the loss over the whole validation split, dropout off."""
        model.eval()
        nll, count = 0.0, 0
        with torch.inference_mode():
            for batch in valid_batches:
                src, tgt_in, tgt_out = tensors([valid[i] for i in batch])
                _, mean, n = smoothed_loss(torch, model(src, tgt_in), tgt_out, pad, smoothing)
                nll, count = nll + float(mean) * n, count + n
        model.train()
        return nll / count, count

    print(json.dumps({"cached_decoding_max_diff": check_cached_decoding(
        torch, model, valid, ids, device)}), flush=True)
    kept, step, epoch, position = [], 0, 0, 0
    order = shuffled(len(batches), train["seed"], 0)
    tokens = 0
    print(json.dumps({"pairs": len(pairs), "batches_per_epoch": len(batches),
                      "torch": torch.__version__, "device": str(device),
                      "threads": torch.get_num_threads()}), flush=True)
    # The budget is wall-clock from the first step, validations and checkpoints included,
    # as `xfmr train --minutes` counts it; the evaluations of --bleu-every are left out.
    started, outside = time.perf_counter(), 0.0
    elapsed = lambda: time.perf_counter() - started - outside  # noqa: E731
    while step < steps and (minutes is None or elapsed() < 60 * minutes):
        if position == len(order):
            epoch, position = epoch + 1, 0
            order = shuffled(len(batches), train["seed"], epoch)
        rows = [pairs[i] for i in batches[order[position]]]
        position += 1
        step += 1
        src, tgt_in, tgt_out = tensors(rows)
        tokens += sum(len(s) + 1 + len(t) + 1 for s, t in rows)
        lr = factor * d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        for group in optim.param_groups:
            group["lr"] = lr
        loss, _, _ = smoothed_loss(torch, model(src, tgt_in), tgt_out, pad, smoothing)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        sync()
        if step % 50 == 0:
            print(json.dumps({"step": step, "epoch": epoch, "loss": loss.item(), "lr": lr,
                              "elapsed_s": round(elapsed(), 2)}), flush=True)
        if step % train["checkpoint_every"] == 0:
            kept = (kept + [copy.deepcopy(model.state_dict())])[-train["average"]:]
        if train["eval_every"] and step % train["eval_every"] == 0:
            nll, count = validate()
            print(json.dumps({"step": step, "elapsed_s": round(elapsed(), 2),
                              "valid_nll": nll, "valid_ppl": math.exp(nll),
                              "valid_tokens": count}), flush=True)
        if args.bleu_every and step % args.bleu_every == 0:
            t = time.perf_counter()
            bleu, _ = scores(translate(torch, model, tok, [s for s, _ in test], ids, device),
                             refs)
            outside += time.perf_counter() - t
            print(json.dumps({"step": step, "elapsed_s": round(elapsed(), 2),
                              "test_bleu_greedy": round(bleu, 2)}), flush=True)
    trained = elapsed()
    nll, count = validate()
    if step % train["checkpoint_every"] != 0:
        kept = (kept + [copy.deepcopy(model.state_dict())])[-train["average"]:]
    # The final model: the average of the last checkpoints (paper §6.1), as xfmr's.
    averaged = {k: sum(s[k].float() for s in kept) / len(kept) for k in kept[0]}
    model.load_state_dict({k: v.to(kept[0][k].dtype) for k, v in averaged.items()})
    if not test:  # --test-sentences 0: training and validation only, as `xfmr train` skips
        print(json.dumps({"final": True, "steps": step, "train_s": round(trained, 2),
                          "tokens_per_s": round(tokens / trained), "valid_ppl": math.exp(nll),
                          "valid_tokens": count}), flush=True)
        return
    t = time.perf_counter()
    # Beam search's length penalty chosen on (at most) the first 500 validation pairs, the
    # highest BLEU, the first tried on ties, as `xfmr train` chooses it.
    held = valid[:500]
    tried = []
    for alpha in LENGTH_PENALTIES:
        hyps = translate(torch, model, tok, [s for s, _ in held], ids, device, args.beam, alpha)
        tried.append((alpha, scores(hyps, valid_refs[:500])[0]))
    alpha = max(tried, key=lambda a: a[1])[0]
    sources = [s for s, _ in test]
    greedy = translate(torch, model, tok, sources, ids, device)
    beam = translate(torch, model, tok, sources, ids, device, args.beam, alpha)
    (bleu_g, chrf_g), (bleu_b, chrf_b) = scores(greedy, refs), scores(beam, refs)
    print(json.dumps({"final": True, "steps": step, "epochs": epoch + position / len(order),
                      "train_s": round(trained, 2), "tokens_per_s": round(tokens / trained),
                      "valid_ppl": math.exp(nll), "valid_tokens": count,
                      "averaged": len(kept), "length_penalty": alpha,
                      "length_penalties_tried": tried,
                      "test_bleu_greedy": round(bleu_g, 2), "test_bleu_beam": round(bleu_b, 2),
                      "test_chrf_greedy": round(chrf_g, 2), "test_chrf_beam": round(chrf_b, 2),
                      "test_sentences": len(test),
                      "decode_s": round(time.perf_counter() - t, 1)}), flush=True)
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(beam) + "\n")
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
